"""The tree ensembles of ``ai.onnx.ml``: TreeEnsemble{Regressor,Classifier} and TreeEnsemble.

What scikit-learn's forests, boosted trees and decision trees export to
(skl2onnx). Every form is read, when the graph is prepared, into one
:class:`_Forest` of numpy tables: the internal nodes (feature, threshold, mode,
the missing-value rule, the two children), the leaves (one row of weights per
leaf, one column per target or class) and one root per tree. A child or root
is a *pointer*: ``i < M`` is internal node ``i``, ``M + j`` is leaf ``j``.

Evaluation moves every ``(sample, tree)`` pointer one level per step, for a
fixed number of steps (the deepest path, known when prepared), in one
``lax.fori_loop``: no Python loop over samples or trees. Node ``i`` sends
``x = X[n, feature[i]]`` to its true child when ``compare(x, threshold[i])``
holds or when ``x`` is NaN and ``missing_tracks_true[i]`` (as onnxruntime:
``BRANCH_NEQ`` is true for a NaN). Then the leaves' rows are aggregated over
the trees (``SUM``, ``AVERAGE``, ``MIN``, ``MAX``; a target no reached leaf
writes is 0), ``base_values`` are added and the post-transform applied.

Thresholds are compared exactly: on float32 features, a float64 threshold
``t`` (the ``_as_tensor`` forms) becomes the float32 value that decides every
float32 ``x`` alike (``x <= t`` iff ``x <= round_down(t)``), so 32-bit JAX
compares as onnxruntime does in double.

A malformed file is refused by name when prepared: attribute arrays of
unequal lengths, a node or tree id out of range or repeated, a child that is
not there, a cycle (a hostile file must not hang), string labels (XLA holds
no strings); and, as onnxruntime refuses them, TreeEnsemble's nodes_splits,
leaf_weights or membership_values of another type than X, when X is known.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.onnx_tensors import STRINGS_ADVICE, refuse_narrowing
from onnx_optax._src.ops.arrays import check_size
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.ml import ML_DOMAIN, _first_max, _post_transform, _rows, _transform
from onnx_optax._src.ops.registry import Node

LEQ, LT, GTE, GT, EQ, NEQ, MEMBER = range(7)  # TreeEnsemble's nodes_modes (opset 5)
_MODES = {"BRANCH_LEQ": LEQ, "BRANCH_LT": LT, "BRANCH_GTE": GTE, "BRANCH_GT": GT}
_MODES |= {"BRANCH_EQ": EQ, "BRANCH_NEQ": NEQ}
_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")  # TreeEnsemble's aggregate_function codes
_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")  # its post_transform


@dataclasses.dataclass(frozen=True)
class _Forest:
    """An ensemble as tables; pointers ``< M`` are internal nodes, ``M + j`` leaf ``j``."""

    feature: np.ndarray  # [M] int64
    threshold: np.ndarray  # [M] float64
    mode: np.ndarray  # [M] int64, LEQ..MEMBER
    members: np.ndarray  # [M, K] float64, NaN-padded (K = 0 without MEMBER nodes)
    tracks: np.ndarray  # [M] bool: a NaN goes to the true child
    true_next: np.ndarray  # [M] int64 pointers
    false_next: np.ndarray  # [M] int64 pointers
    roots: np.ndarray  # [T] int64 pointers
    leaves: np.ndarray  # [L, targets] float64 weights
    hit: np.ndarray  # [L, targets] bool: the leaf writes that target
    depth: int  # the most internal nodes on a path from a root
    double: bool  # weights given as float64 (accumulated so where JAX is 64-bit)


# ----------------------------------------------------------------------------- reading


def _array(node: Node, name: str, dtype: Any) -> np.ndarray:
    """An attribute (list or tensor) as a flat numpy array; empty when absent."""
    value = node.get(name)
    return np.asarray([] if value is None else value).astype(dtype).reshape(-1)


def _floats(node: Node, name: str) -> np.ndarray:
    """``name`` or ``name_as_tensor`` (float64), refusing both at once."""
    plain, tensor = node.get(name), node.get(f"{name}_as_tensor")
    if plain is not None and tensor is not None:
        raise ValueError(f"{node.where}: sets both {name} and {name}_as_tensor; give one")
    return _array(node, f"{name}_as_tensor" if tensor is not None else name, np.float64)


def _same_lengths(node: Node, arrays: dict[str, np.ndarray], required: Sequence[str]) -> int:
    """The common length of ``arrays`` (the empty optional ones left out)."""
    lengths = {name: a.size for name, a in arrays.items() if a.size or name in required}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name} {n}" for name, n in lengths.items())
        raise ValueError(
            f"{node.where}: its node attributes must have one length each, got {listed}"
        )
    return next(iter(lengths.values()), 0)


def _in_range(node: Node, name: str, values: np.ndarray, size: int) -> None:
    outside = values[(values < 0) | (values >= size)]
    if outside.size:
        raise ValueError(f"{node.where}: {name} holds {int(outside[0])}, out of range [0, {size})")


def _depth(node: Node, roots: np.ndarray, true_next: np.ndarray, false_next: np.ndarray) -> int:
    """The most internal nodes on a path from a root (Kahn's order; a cycle is refused).

    Linear in the number of nodes, so a hostile file cannot make it hang; a node
    no root reaches costs no step.
    """
    m = true_next.size
    children = [[int(c) for c in (true_next[i], false_next[i]) if c < m] for i in range(m)]
    indegree = [0] * m
    for kids in children:
        for c in kids:
            indegree[c] += 1
    ready = [i for i in range(m) if indegree[i] == 0]
    order = []
    while ready:
        i = ready.pop()
        order.append(i)
        for c in children[i]:
            indegree[c] -= 1
            if indegree[c] == 0:
                ready.append(c)
    if len(order) < m:
        raise ValueError(
            f"{node.where}: its trees hold a cycle (a node is its own descendant); a tree's "
            "children must lead to leaves"
        )
    depth = [0] * m
    for r in roots.tolist():
        if r < m:
            depth[r] = 1
    for i in order:
        if depth[i]:
            for c in children[i]:
                depth[c] = max(depth[c], depth[i] + 1)
    return max(depth, default=0)


def _leaf_table(
    node: Node,
    leaf: np.ndarray,
    target: np.ndarray,
    weight: np.ndarray,
    leaves: int,
    targets: int,
    aggregate: str,
) -> tuple[np.ndarray, np.ndarray]:
    """``[leaves, targets]`` weights and which are written (several on one cell combine)."""
    _in_range(node, "a target/class id", target, targets)
    check_size(node, (leaves, targets), np.float64, "leaf table (leaves x targets)")
    table = np.zeros((leaves, targets), np.float64)
    hit = np.zeros((leaves, targets), bool)
    if aggregate == "MIN":
        table[:] = np.inf
        np.minimum.at(table, (leaf, target), weight)
    elif aggregate == "MAX":
        table[:] = -np.inf
        np.maximum.at(table, (leaf, target), weight)
    else:
        np.add.at(table, (leaf, target), weight)
    hit[leaf, target] = True
    return np.where(hit, table, 0.0), hit


def _legacy_forest(node: Node, prefix: str, aggregate: str, targets: int) -> _Forest:
    """The forest of TreeEnsembleRegressor (prefix ``target``) or ...Classifier (``class``)."""
    arrays = {
        "nodes_treeids": _array(node, "nodes_treeids", np.int64),
        "nodes_nodeids": _array(node, "nodes_nodeids", np.int64),
        "nodes_featureids": _array(node, "nodes_featureids", np.int64),
        "nodes_truenodeids": _array(node, "nodes_truenodeids", np.int64),
        "nodes_falsenodeids": _array(node, "nodes_falsenodeids", np.int64),
        "nodes_values": _floats(node, "nodes_values"),
        "nodes_missing_value_tracks_true": _array(
            node, "nodes_missing_value_tracks_true", np.int64
        ),
        "nodes_modes": np.asarray(node.get("nodes_modes") or [], object),
    }
    count = _same_lengths(node, arrays, ("nodes_treeids", "nodes_nodeids", "nodes_modes"))
    if not count:
        raise ValueError(f"{node.where}: has no tree nodes (nodes_treeids is empty)")
    unknown = sorted({str(m) for m in arrays["nodes_modes"]} - {*_MODES, "LEAF"})
    if unknown:
        raise ValueError(
            f"{node.where}: nodes_modes holds {unknown[0]!r}; it must be one of "
            f"{', '.join(_MODES)}, LEAF"
        )
    trees, ids = arrays["nodes_treeids"], arrays["nodes_nodeids"]
    index: dict[tuple[int, int], int] = {}
    for i, key in enumerate(zip(trees.tolist(), ids.tolist(), strict=True)):
        if key in index:
            raise ValueError(f"{node.where}: tree {key[0]} has node id {key[1]} twice")
        index[key] = i
    is_leaf = arrays["nodes_modes"] == "LEAF"
    internal = np.flatnonzero(~is_leaf)
    position = np.zeros(count, np.int64)  # node index -> pointer
    position[internal] = np.arange(internal.size)
    position[is_leaf] = internal.size + np.arange(int(is_leaf.sum()))

    def pointer(tree: int, child: int, which: str) -> int:
        found = index.get((tree, child))
        if found is None:
            raise ValueError(f"{node.where}: tree {tree} has no node {child} ({which})")
        return int(position[found])

    true_next = np.array(
        [pointer(trees[i], arrays["nodes_truenodeids"][i], "a true child") for i in internal],
        np.int64,
    )
    false_next = np.array(
        [pointer(trees[i], arrays["nodes_falsenodeids"][i], "a false child") for i in internal],
        np.int64,
    )
    first = {int(t): int(position[i]) for i, t in reversed(list(enumerate(trees.tolist())))}
    roots = np.array(list(first.values()), np.int64)
    targets_at = {
        "treeids": _array(node, f"{prefix}_treeids", np.int64),
        "nodeids": _array(node, f"{prefix}_nodeids", np.int64),
        "ids": _array(node, f"{prefix}_ids", np.int64),
        "weights": _floats(node, f"{prefix}_weights"),
    }
    _same_lengths(
        node,
        {f"{prefix}_{k}": v for k, v in targets_at.items()},
        [f"{prefix}_{k}" for k in targets_at],
    )
    leaf = []
    for tree, nid in zip(
        targets_at["treeids"].tolist(), targets_at["nodeids"].tolist(), strict=True
    ):
        found = index.get((tree, nid))
        if found is None or not is_leaf[found]:
            raise ValueError(
                f"{node.where}: {prefix} weight names tree {tree} node {nid}, which is no leaf"
            )
        leaf.append(int(position[found]) - internal.size)
    table, hit = _leaf_table(
        node,
        np.asarray(leaf, np.int64),
        targets_at["ids"],
        targets_at["weights"],
        int(is_leaf.sum()),
        targets,
        aggregate,
    )
    _in_range(node, "nodes_featureids", arrays["nodes_featureids"][internal], 2**31)
    tracks = arrays["nodes_missing_value_tracks_true"]
    mode = np.array([_MODES[str(m)] for m in arrays["nodes_modes"][internal]], np.int64)
    values = arrays["nodes_values"]
    if internal.size and not values.size:
        raise ValueError(f"{node.where}: its branch nodes have no thresholds (nodes_values)")
    return _Forest(
        feature=arrays["nodes_featureids"][internal],
        threshold=values[internal] if values.size else np.zeros(internal.size),
        mode=mode,
        members=np.zeros((internal.size, 0)),
        tracks=(tracks[internal] != 0) if tracks.size else np.zeros(internal.size, bool),
        true_next=true_next,
        false_next=false_next,
        roots=roots,
        leaves=table,
        hit=hit,
        depth=_depth(node, roots, true_next, false_next),
        double=node.get(f"{prefix}_weights_as_tensor") is not None,
    )


def _members(node: Node, mode: np.ndarray) -> np.ndarray:
    """``[M, K]`` sets of the MEMBER nodes from membership_values (each set ends with NaN)."""
    values = _array(node, "membership_values", np.float64)
    member_nodes = np.flatnonzero(mode == MEMBER)
    if not member_nodes.size:
        return np.zeros((mode.size, 0))
    ends = np.flatnonzero(np.isnan(values))
    if ends.size != member_nodes.size:
        raise ValueError(
            f"{node.where}: {member_nodes.size} MEMBER node(s) need as many NaN-ended sets in "
            f"membership_values, found {ends.size}"
        )
    starts = np.concatenate([[0], ends[:-1] + 1])
    width = int(max((ends - starts).max(), 1))
    table = np.full((mode.size, width), np.nan)
    for row, start, end in zip(member_nodes, starts, ends, strict=True):
        table[row, : end - start] = values[start:end]
    return table


def _forest5(node: Node) -> _Forest:
    """The forest of TreeEnsemble (opset 5): internal nodes and leaves in separate arrays."""
    arrays = {
        "nodes_featureids": _array(node, "nodes_featureids", np.int64),
        "nodes_splits": _array(node, "nodes_splits", np.float64),
        "nodes_modes": _array(node, "nodes_modes", np.int64),
        "nodes_truenodeids": _array(node, "nodes_truenodeids", np.int64),
        "nodes_falsenodeids": _array(node, "nodes_falsenodeids", np.int64),
        "nodes_trueleafs": _array(node, "nodes_trueleafs", np.int64),
        "nodes_falseleafs": _array(node, "nodes_falseleafs", np.int64),
        "nodes_missing_value_tracks_true": _array(
            node, "nodes_missing_value_tracks_true", np.int64
        ),
    }
    required = [k for k in arrays if k != "nodes_missing_value_tracks_true"]
    m = _same_lengths(node, arrays, required)
    leaf_targets = _array(node, "leaf_targetids", np.int64)
    weights = _array(node, "leaf_weights", np.float64)
    _same_lengths(
        node,
        {"leaf_targetids": leaf_targets, "leaf_weights": weights},
        ["leaf_targetids", "leaf_weights"],
    )
    leaves = leaf_targets.size
    mode = arrays["nodes_modes"]
    _in_range(node, "nodes_modes", mode, 7)
    _in_range(node, "nodes_featureids", arrays["nodes_featureids"], 2**31)
    roots_at = _array(node, "tree_roots", np.int64)
    if not roots_at.size:
        raise ValueError(f"{node.where}: tree_roots is empty; an ensemble needs a tree")
    _in_range(node, "tree_roots", roots_at, m)

    def children(ids: str, leafs: str) -> np.ndarray:
        is_leaf = arrays[leafs] != 0
        _in_range(node, f"{ids} (of leaf children)", arrays[ids][is_leaf], leaves)
        _in_range(node, f"{ids} (of node children)", arrays[ids][~is_leaf], m)
        return np.where(is_leaf, m + arrays[ids], arrays[ids])

    true_next = children("nodes_truenodeids", "nodes_trueleafs")
    false_next = children("nodes_falsenodeids", "nodes_falseleafs")
    # a one-leaf tree: its root entry leads both ways to the same leaf
    single = (true_next[roots_at] >= m) & (true_next[roots_at] == false_next[roots_at])
    roots = np.where(single, true_next[roots_at], roots_at)
    aggregate = _AGGREGATES[_code(node, "aggregate_function", _AGGREGATES)]
    table, hit = _leaf_table(
        node, np.arange(leaves), leaf_targets, weights, leaves, _targets(node), aggregate
    )
    tracks = arrays["nodes_missing_value_tracks_true"]
    return _Forest(
        feature=arrays["nodes_featureids"],
        threshold=arrays["nodes_splits"],
        mode=mode,
        members=_members(node, mode),
        tracks=(tracks != 0) if tracks.size else np.zeros(m, bool),
        true_next=true_next,
        false_next=false_next,
        roots=roots,
        leaves=table,
        hit=hit,
        depth=_depth(node, roots, true_next, false_next),
        double=np.asarray(node.get("leaf_weights")).dtype == np.float64,
    )


def _targets(node: Node) -> int:
    targets = int(node.get("n_targets") or 0)
    if targets < 1:
        raise ValueError(f"{node.where}: n_targets is {targets}; it must be at least 1")
    return targets


def _code(node: Node, name: str, names: Sequence[str]) -> int:
    value = int(node[name])
    if not 0 <= value < len(names):
        raise ValueError(f"{node.where}: {name} is {value}; it must be 0 to {len(names) - 1}")
    return value


# ----------------------------------------------------------------------------- evaluation


def _as_float32_thresholds(threshold: np.ndarray, mode: np.ndarray) -> np.ndarray:
    """float64 thresholds as float32 ones that decide every float32 x alike."""
    near = threshold.astype(np.float32)
    wide = near.astype(np.float64)
    down = np.where(wide > threshold, np.nextafter(near, np.float32(-np.inf)), near)
    up = np.where(wide < threshold, np.nextafter(near, np.float32(np.inf)), near)
    exact = np.where(wide == threshold, near, np.float32(np.nan))  # EQ/NEQ: unequal to all
    return np.select([np.isin(mode, (LEQ, GT)), np.isin(mode, (LT, GTE))], [down, up], exact)


def _leaf_pointers(node: Node, forest: _Forest, x: Any) -> Any:
    """``[N, T]`` leaf indices reached by every sample in every tree."""
    m = forest.true_next.size
    n = x.shape[0]
    pointers = jnp.broadcast_to(jnp.asarray(forest.roots), (n, forest.roots.size))
    if m == 0 or forest.depth == 0:
        return pointers - m
    if x.shape[1] <= int(forest.feature.max()):
        raise ValueError(
            f"{node.where}: a node reads feature {int(forest.feature.max())} but X has "
            f"{x.shape[1]} feature(s)"
        )
    if x.dtype == np.float32:
        threshold = _as_float32_thresholds(forest.threshold, forest.mode)
        members = _as_float32_thresholds(forest.members, np.full(forest.members.shape, EQ))
    else:
        threshold, members = forest.threshold, forest.members
    table = {
        "feature": jnp.asarray(forest.feature.astype(np.int32)),
        "threshold": jnp.asarray(threshold, x.dtype),
        "mode": jnp.asarray(forest.mode.astype(np.int32)),
        "tracks": jnp.asarray(forest.tracks),
        "true": jnp.asarray(forest.true_next.astype(np.int32)),
        "false": jnp.asarray(forest.false_next.astype(np.int32)),
        "members": jnp.asarray(members, x.dtype),
    }
    rows = jnp.arange(n)[:, None]

    def step(_: Any, p: Any) -> Any:
        at = jnp.minimum(p, m - 1)
        value = x[rows, table["feature"][at]]
        t = table["threshold"][at]
        tests = [value <= t, value < t, value >= t, value > t, value == t, value != t]
        if members.shape[1]:
            tests.append(jnp.any(value[..., None] == table["members"][at], axis=-1))
        mode = table["mode"][at]
        passed = jnp.select([mode == k for k in range(len(tests))], tests, False)
        passed = passed | (table["tracks"][at] & jnp.isnan(value))
        moved = jnp.where(passed, table["true"][at], table["false"][at])
        return jnp.where(p < m, moved, p)

    pointers = lax.fori_loop(0, forest.depth, step, pointers.astype(jnp.int32))
    return pointers - m


def _aggregate(node: Node, forest: _Forest, x: Any, aggregate: str) -> Any:
    """``[N, targets]``: the reached leaves' weights combined over the trees.

    Computed in float64 where JAX is 64-bit and X or the weights are double,
    else in float32 (as onnxruntime, in its threshold type); a sum adds the
    trees one by one in their order, as onnxruntime does, so that ties break alike.
    """
    wide = jax.config.read("jax_enable_x64") and (forest.double or x.dtype == np.float64)
    dtype = np.float64 if wide else np.float32
    leaf = _leaf_pointers(node, forest, x)
    check_size(node, (x.shape[0], forest.roots.size, forest.leaves.shape[1]), dtype, "leaf weights")
    values = jnp.asarray(forest.leaves, dtype)[leaf]
    if aggregate in ("SUM", "AVERAGE"):
        start = jnp.zeros((x.shape[0], forest.leaves.shape[1]), dtype)
        total, _ = lax.scan(lambda acc, v: (acc + v, None), start, jnp.swapaxes(values, 0, 1))
        return total / forest.roots.size if aggregate == "AVERAGE" else total
    hit = jnp.asarray(forest.hit)[leaf]
    fill = jnp.inf if aggregate == "MIN" else -jnp.inf
    picked = jnp.where(hit, values, fill)
    best = jnp.min(picked, axis=1) if aggregate == "MIN" else jnp.max(picked, axis=1)
    return jnp.where(jnp.any(hit, axis=1), best, 0)


def _features(node: Node, x: Any, forest: _Forest) -> Any:
    """X as ``[N, C]`` in the compute dtype: float64 stays (64-bit JAX), the rest float32.

    A 1-D X is one sample; onnxruntime reads it as one of one feature, so a node
    reading another feature is refused.
    """
    internal = forest.feature[: forest.true_next.size]
    if np.ndim(x) == 1 and internal.size and int(internal.max()) >= 1:
        raise ValueError(
            f"{node.where}: a node reads feature {int(internal.max())} but X is 1-D, which "
            "onnxruntime reads as one sample of one feature; give X as [N, C]"
        )
    if np.dtype(x.dtype) == np.float16:
        x = jnp.asarray(x, np.float32)
    if np.dtype(x.dtype) == np.float64 and jax.config.read("jax_enable_x64"):
        if np.ndim(x) not in (1, 2):
            raise ValueError(
                f"{node.where}: input X has shape {list(np.shape(x))}; it must be [N, C] or [C]"
            )
        x = jnp.asarray(x)
        return x.reshape(1, -1) if x.ndim == 1 else x
    return _rows(node, x)


# ----------------------------------------------------------------------------- ops


def _prepared(build: Any) -> Any:
    """A registry check that reads the whole forest when the graph is prepared."""

    def check(node: Node) -> None:
        build(node)

    return check


def _regressor_check(node: Node) -> _Forest:
    aggregate = str(node["aggregate_function"])
    if aggregate not in _AGGREGATES:
        raise ValueError(
            f"{node.where}: aggregate_function {aggregate!r} is not one of {', '.join(_AGGREGATES)}"
        )
    _transform(node)
    targets = int(node["n_targets"] or 0)
    if targets < 1:
        raise ValueError(f"{node.where}: n_targets is {targets}; it must be at least 1")
    base = _floats(node, "base_values")
    if base.size not in (0, targets):
        raise ValueError(
            f"{node.where}: {base.size} base_values for {targets} target(s); give one per "
            "target, or none"
        )
    return _legacy_forest(node, "target", aggregate, targets)


@register("TreeEnsembleRegressor", domain=ML_DOMAIN, check=_prepared(_regressor_check))
def _tree_ensemble_regressor(node: Node, x: Any) -> Any:
    """``post_transform(aggregate over trees of the reached leaves' weights + base_values)``.

    ``AVERAGE`` divides the sum by the number of trees; the output is float32.
    """
    forest = _regressor_check(node)
    rows = _features(node, x, forest)
    scores = _aggregate(node, forest, rows, str(node["aggregate_function"]))
    base = _floats(node, "base_values")
    if base.size:
        scores = scores + jnp.asarray(base, scores.dtype)
    return _post_transform(scores, _transform(node)).astype(np.float32)


def _class_labels(node: Node) -> np.ndarray:
    strings = node.get("classlabels_strings") or []
    if len(strings):
        raise ValueError(
            f"{node.where}: its classes are strings (classlabels_strings), so its label output "
            f"would be a string tensor; {STRINGS_ADVICE}"
        )
    labels = _array(node, "classlabels_int64s", np.int64)
    if labels.size < 2:
        raise ValueError(
            f"{node.where}: has {labels.size} class label(s) in classlabels_int64s; it needs "
            "at least 2"
        )
    return labels


def _classifier_check(node: Node) -> _Forest:
    labels = _class_labels(node)
    transform = _transform(node)
    forest = _legacy_forest(node, "class", "SUM", labels.size)
    base = _floats(node, "base_values")
    ids = np.unique(_array(node, "class_ids", np.int64))
    if labels.size == 2 and ids.size == 1:
        if transform == "PROBIT":
            raise ValueError(
                f"{node.where}: post_transform PROBIT on a one-score binary classifier has no "
                "defined second column (onnxruntime leaves it unwritten)"
            )
        if base.size > 1 or ids[0] != 0:
            raise ValueError(
                f"{node.where}: a one-score binary classifier (every class_ids is {int(ids[0])}) "
                f"is read only with class id 0 and one base value or none (got {base.size}): "
                "onnxruntime's results for the other forms are undefined"
            )
    elif base.size not in (0, labels.size):
        raise ValueError(
            f"{node.where}: {base.size} base_values for {labels.size} classes; give one per "
            "class, or none"
        )
    return forest


@register("TreeEnsembleClassifier", domain=ML_DOMAIN, check=_prepared(_classifier_check))
def _tree_ensemble_classifier(node: Node, x: Any) -> tuple[Any, Any]:
    """Labels ``[N]`` and scores ``[N, classes]``: leaf weights summed over the trees.

    With several scores per class the label is that of the largest sum (plus
    base_values) and the scores are post-transformed. A binary classifier whose
    leaves all write class 0 has one score ``s`` (as onnxruntime): with
    weights all >= 0, label by ``s > 0.5`` and scores ``[1 - s, s]``; otherwise
    label by ``s > 0`` and scores ``[-s, s]``; ``[sigmoid(-s), sigmoid(s)]``
    under LOGISTIC either way.
    """
    forest = _classifier_check(node)
    labels = _class_labels(node)
    refuse_narrowing(f"{node.where}: classlabels_int64s", labels)
    rows = _features(node, x, forest)
    scores = _aggregate(node, forest, rows, "SUM")
    base = _floats(node, "base_values")
    ids = np.unique(_array(node, "class_ids", np.int64))
    table = jnp.asarray(labels)
    transform = _transform(node)
    if labels.size == 2 and ids.size == 1:
        s = scores[:, 0] + (base[0] if base.size else 0.0)
        positive = bool(np.all(_floats(node, "class_weights") >= 0))
        label = jnp.where(s > (0.5 if positive else 0.0), table[1], table[0])
        if transform == "LOGISTIC":
            z = jax.nn.sigmoid(jnp.stack([-s, s], axis=1))
        else:
            z = jnp.stack([1 - s if positive else -s, s], axis=1)
        return label, z.astype(np.float32)
    if base.size:
        scores = scores + jnp.asarray(base, scores.dtype)
    label = jnp.take(table, _first_max(scores))
    return label, _post_transform(scores, transform).astype(np.float32)


def _ensemble_check(node: Node) -> _Forest:
    _code(node, "post_transform", _TRANSFORMS)
    _targets(node)
    return _forest5(node)


@register("TreeEnsemble", domain=ML_DOMAIN, check=_prepared(_ensemble_check))
def _tree_ensemble(node: Node, x: Any) -> Any:
    """``post_transform(aggregate over trees of the reached leaves' weights)``, X's dtype.

    Opset 5's form: BRANCH modes as codes (0 LEQ .. 5 NEQ, 6 MEMBER of a set in
    membership_values), leaves as separate (target, weight) arrays.
    """
    forest = _ensemble_check(node)
    if np.dtype(x.dtype) not in (np.float32, np.float64, np.float16):
        raise TypeError(
            f"{node.where}: input X has dtype {x.dtype}; it must be float, double or float16"
        )
    for name in ("nodes_splits", "leaf_weights", "membership_values"):  # T, as X (onnxruntime)
        value = node.get(name)
        if value is not None and np.dtype(value.dtype) != np.dtype(x.dtype):
            raise TypeError(
                f"{node.where}: {name} is {np.dtype(value.dtype)} but X is {np.dtype(x.dtype)}; "
                "the schema makes them one type"
            )
    rows = _features(node, x, forest)
    aggregate = _AGGREGATES[int(node["aggregate_function"])]
    scores = _aggregate(node, forest, rows, aggregate)
    transform = _TRANSFORMS[int(node["post_transform"])]
    return _post_transform(scores, transform).astype(x.dtype)
