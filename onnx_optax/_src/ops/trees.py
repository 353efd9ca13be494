"""The tree ensembles of ``ai.onnx.ml``: TreeEnsemble{Regressor,Classifier} and TreeEnsemble.

What scikit-learn's forests, boosted trees and decision trees export to
(skl2onnx). Every form is read, when the graph is prepared, into one
``forests.Forest`` of numpy tables: the internal nodes (feature, threshold, mode,
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

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.onnx_tensors import STRINGS_ADVICE, refuse_narrowing
from onnx_optax._src.ops.arrays import check_size
from onnx_optax._src.ops.forests import (
    AGGREGATES,
    EQ,
    GT,
    GTE,
    LEQ,
    LT,
    TRANSFORMS,
    Forest,
    attr_array,
    attr_code,
    attr_floats,
    forest5,
    legacy_forest,
    target_count,
)
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.ml_scores import (
    ML_DOMAIN,
    feature_rows,
    first_max,
    post_transform,
    post_transform_of,
)
from onnx_optax._src.ops.registry import Node

# ----------------------------------------------------------------------------- evaluation


def _as_float32_thresholds(threshold: np.ndarray, mode: np.ndarray) -> np.ndarray:
    """float64 thresholds as float32 ones that decide every float32 x alike."""
    near = threshold.astype(np.float32)
    wide = near.astype(np.float64)
    down = np.where(wide > threshold, np.nextafter(near, np.float32(-np.inf)), near)
    up = np.where(wide < threshold, np.nextafter(near, np.float32(np.inf)), near)
    exact = np.where(wide == threshold, near, np.float32(np.nan))  # EQ/NEQ: unequal to all
    return np.select([np.isin(mode, (LEQ, GT)), np.isin(mode, (LT, GTE))], [down, up], exact)


def _leaf_pointers(node: Node, forest: Forest, x: Any) -> Any:
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


def _aggregate(node: Node, forest: Forest, x: Any, aggregate: str) -> Any:
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


def _features(node: Node, x: Any, forest: Forest) -> Any:
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
    return feature_rows(node, x)


# ----------------------------------------------------------------------------- ops


def _prepared(build: Any) -> Any:
    """A registry check that reads the whole forest when the graph is prepared."""

    def check(node: Node) -> None:
        build(node)

    return check


def _regressor_check(node: Node) -> Forest:
    aggregate = str(node["aggregate_function"])
    if aggregate not in AGGREGATES:
        raise ValueError(
            f"{node.where}: aggregate_function {aggregate!r} is not one of {', '.join(AGGREGATES)}"
        )
    post_transform_of(node)
    targets = int(node["n_targets"] or 0)
    if targets < 1:
        raise ValueError(f"{node.where}: n_targets is {targets}; it must be at least 1")
    base = attr_floats(node, "base_values")
    if base.size not in (0, targets):
        raise ValueError(
            f"{node.where}: {base.size} base_values for {targets} target(s); give one per "
            "target, or none"
        )
    return legacy_forest(node, "target", aggregate, targets)


@register("TreeEnsembleRegressor", domain=ML_DOMAIN, check=_prepared(_regressor_check))
def _tree_ensemble_regressor(node: Node, x: Any) -> Any:
    """``post_transform(aggregate over trees of the reached leaves' weights + base_values)``.

    ``AVERAGE`` divides the sum by the number of trees; the output is float32.
    """
    forest = _regressor_check(node)
    rows = _features(node, x, forest)
    scores = _aggregate(node, forest, rows, str(node["aggregate_function"]))
    base = attr_floats(node, "base_values")
    if base.size:
        scores = scores + jnp.asarray(base, scores.dtype)
    return post_transform(scores, post_transform_of(node)).astype(np.float32)


def _class_labels(node: Node) -> np.ndarray:
    strings = node.get("classlabels_strings") or []
    if len(strings):
        raise ValueError(
            f"{node.where}: its classes are strings (classlabels_strings), so its label output "
            f"would be a string tensor; {STRINGS_ADVICE}"
        )
    labels = attr_array(node, "classlabels_int64s", np.int64)
    if labels.size < 2:
        raise ValueError(
            f"{node.where}: has {labels.size} class label(s) in classlabels_int64s; it needs "
            "at least 2"
        )
    return labels


def _classifier_check(node: Node) -> Forest:
    labels = _class_labels(node)
    transform = post_transform_of(node)
    forest = legacy_forest(node, "class", "SUM", labels.size)
    base = attr_floats(node, "base_values")
    ids = np.unique(attr_array(node, "class_ids", np.int64))
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
    base = attr_floats(node, "base_values")
    ids = np.unique(attr_array(node, "class_ids", np.int64))
    table = jnp.asarray(labels)
    transform = post_transform_of(node)
    if labels.size == 2 and ids.size == 1:
        s = scores[:, 0] + (base[0] if base.size else 0.0)
        positive = bool(np.all(attr_floats(node, "class_weights") >= 0))
        label = jnp.where(s > (0.5 if positive else 0.0), table[1], table[0])
        if transform == "LOGISTIC":
            z = jax.nn.sigmoid(jnp.stack([-s, s], axis=1))
        else:
            z = jnp.stack([1 - s if positive else -s, s], axis=1)
        return label, z.astype(np.float32)
    if base.size:
        scores = scores + jnp.asarray(base, scores.dtype)
    label = jnp.take(table, first_max(scores))
    return label, post_transform(scores, transform).astype(np.float32)


def _ensemble_check(node: Node) -> Forest:
    attr_code(node, "post_transform", TRANSFORMS)
    target_count(node)
    return forest5(node)


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
    aggregate = AGGREGATES[int(node["aggregate_function"])]
    scores = _aggregate(node, forest, rows, aggregate)
    transform = TRANSFORMS[int(node["post_transform"])]
    return post_transform(scores, transform).astype(x.dtype)
