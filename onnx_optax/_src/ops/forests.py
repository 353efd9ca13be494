"""An ``ai.onnx.ml`` tree ensemble read from its node's attributes into one :class:`Forest`.

Every form (TreeEnsembleRegressor's and ...Classifier's ``nodes_*``/``target_*``/
``class_*`` attributes, TreeEnsemble's ``nodes_splits``/``leaf_*`` tensors) is read,
when the graph is prepared, into numpy tables: the internal nodes (feature, threshold,
mode, the missing-value rule, the two children), the leaves (one row of weights per
leaf, one column per target or class) and one root per tree. A child or root is a
*pointer*: ``i < M`` is internal node ``i``, ``M + j`` is leaf ``j``. A malformed file
is refused by name here (see ``trees``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from onnx_optax._src.ops.arrays import check_size
from onnx_optax._src.ops.registry import Node

LEQ, LT, GTE, GT, EQ, NEQ, MEMBER = range(7)  # TreeEnsemble's nodes_modes (opset 5)


LEQ, LT, GTE, GT, EQ, NEQ, MEMBER = range(7)  # TreeEnsemble's nodes_modes (opset 5)
_MODES = {"BRANCH_LEQ": LEQ, "BRANCH_LT": LT, "BRANCH_GTE": GTE, "BRANCH_GT": GT}
_MODES |= {"BRANCH_EQ": EQ, "BRANCH_NEQ": NEQ}
AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")  # TreeEnsemble's aggregate_function codes
TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")  # its post_transform


@dataclasses.dataclass(frozen=True)
class Forest:
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


def attr_array(node: Node, name: str, dtype: Any) -> np.ndarray:
    """An attribute (list or tensor) as a flat numpy array; empty when absent."""
    value = node.get(name)
    return np.asarray([] if value is None else value).astype(dtype).reshape(-1)


def attr_floats(node: Node, name: str) -> np.ndarray:
    """``name`` or ``name_as_tensor`` (float64), refusing both at once."""
    plain, tensor = node.get(name), node.get(f"{name}_as_tensor")
    if plain is not None and tensor is not None:
        raise ValueError(f"{node.where}: sets both {name} and {name}_as_tensor; give one")
    return attr_array(node, f"{name}_as_tensor" if tensor is not None else name, np.float64)


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


def _legacy_nodes(node: Node) -> tuple[dict[str, np.ndarray], int]:
    """The node attributes of a legacy ensemble as arrays of one length, and that length."""
    arrays = {
        "nodes_treeids": attr_array(node, "nodes_treeids", np.int64),
        "nodes_nodeids": attr_array(node, "nodes_nodeids", np.int64),
        "nodes_featureids": attr_array(node, "nodes_featureids", np.int64),
        "nodes_truenodeids": attr_array(node, "nodes_truenodeids", np.int64),
        "nodes_falsenodeids": attr_array(node, "nodes_falsenodeids", np.int64),
        "nodes_values": attr_floats(node, "nodes_values"),
        "nodes_missing_value_tracks_true": attr_array(
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
    return arrays, count


def _legacy_leaves(
    node: Node,
    prefix: str,
    index: dict[tuple[int, int], int],
    is_leaf: np.ndarray,
    leaf_of: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The leaf each weight of ``prefix`` names (``leaf_of``: node index -> leaf number),
    with the weights' target ids and values."""
    targets_at = {
        "treeids": attr_array(node, f"{prefix}_treeids", np.int64),
        "nodeids": attr_array(node, f"{prefix}_nodeids", np.int64),
        "ids": attr_array(node, f"{prefix}_ids", np.int64),
        "weights": attr_floats(node, f"{prefix}_weights"),
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
        leaf.append(int(leaf_of[found]))
    return np.asarray(leaf, np.int64), targets_at["ids"], targets_at["weights"]


def legacy_forest(node: Node, prefix: str, aggregate: str, targets: int) -> Forest:
    """The forest of TreeEnsembleRegressor (prefix ``target``) or ...Classifier (``class``)."""
    arrays, count = _legacy_nodes(node)
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
    leaf, target_ids, weights = _legacy_leaves(
        node, prefix, index, is_leaf, position - internal.size
    )
    table, hit = _leaf_table(
        node, leaf, target_ids, weights, int(is_leaf.sum()), targets, aggregate
    )
    _in_range(node, "nodes_featureids", arrays["nodes_featureids"][internal], 2**31)
    tracks = arrays["nodes_missing_value_tracks_true"]
    mode = np.array([_MODES[str(m)] for m in arrays["nodes_modes"][internal]], np.int64)
    values = arrays["nodes_values"]
    if internal.size and not values.size:
        raise ValueError(f"{node.where}: its branch nodes have no thresholds (nodes_values)")
    return Forest(
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
    values = attr_array(node, "membership_values", np.float64)
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


def forest5(node: Node) -> Forest:
    """The forest of TreeEnsemble (opset 5): internal nodes and leaves in separate arrays."""
    arrays = {
        "nodes_featureids": attr_array(node, "nodes_featureids", np.int64),
        "nodes_splits": attr_array(node, "nodes_splits", np.float64),
        "nodes_modes": attr_array(node, "nodes_modes", np.int64),
        "nodes_truenodeids": attr_array(node, "nodes_truenodeids", np.int64),
        "nodes_falsenodeids": attr_array(node, "nodes_falsenodeids", np.int64),
        "nodes_trueleafs": attr_array(node, "nodes_trueleafs", np.int64),
        "nodes_falseleafs": attr_array(node, "nodes_falseleafs", np.int64),
        "nodes_missing_value_tracks_true": attr_array(
            node, "nodes_missing_value_tracks_true", np.int64
        ),
    }
    required = [k for k in arrays if k != "nodes_missing_value_tracks_true"]
    m = _same_lengths(node, arrays, required)
    leaf_targets = attr_array(node, "leaf_targetids", np.int64)
    weights = attr_array(node, "leaf_weights", np.float64)
    _same_lengths(
        node,
        {"leaf_targetids": leaf_targets, "leaf_weights": weights},
        ["leaf_targetids", "leaf_weights"],
    )
    leaves = leaf_targets.size
    mode = arrays["nodes_modes"]
    _in_range(node, "nodes_modes", mode, 7)
    _in_range(node, "nodes_featureids", arrays["nodes_featureids"], 2**31)
    roots_at = attr_array(node, "tree_roots", np.int64)
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
    aggregate = AGGREGATES[attr_code(node, "aggregate_function", AGGREGATES)]
    table, hit = _leaf_table(
        node, np.arange(leaves), leaf_targets, weights, leaves, target_count(node), aggregate
    )
    tracks = arrays["nodes_missing_value_tracks_true"]
    return Forest(
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


def target_count(node: Node) -> int:
    targets = int(node.get("n_targets") or 0)
    if targets < 1:
        raise ValueError(f"{node.where}: n_targets is {targets}; it must be at least 1")
    return targets


def attr_code(node: Node, name: str, names: Sequence[str]) -> int:
    value = int(node[name])
    if not 0 <= value < len(names):
        raise ValueError(f"{node.where}: {name} is {value}; it must be 0 to {len(names) - 1}")
    return value
