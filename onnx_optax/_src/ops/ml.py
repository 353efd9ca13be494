"""The ``ai.onnx.ml`` ops that scikit-learn exports (skl2onnx) put around a model.

Inference only: ``ArrayFeatureExtractor`` (a classifier's label, ``classes[argmax]``),
``Scaler``, ``Normalizer``, ``Binarizer``, ``LinearRegressor``, ``LinearClassifier``
and the numeric encoders ``LabelEncoder``, ``Imputer``, ``OneHotEncoder``, each a
small function registered into the one registry (``ops.registry``) under the
``ai.onnx.ml`` domain; attributes arrive with the ai.onnx.ml schema's defaults
for the model's ai.onnx.ml opset.

The ONNX operator documents leave much of these ops unsaid; they follow
onnxruntime, whose kernels skl2onnx targets and onnx's own reference
implementation copies: features are read as a ``[N, C]`` matrix (a vector is one
row), the linear models compute in float32 (their outputs are float), ``MAX``
normalizes by the largest value (not the largest magnitude), a one-column score
takes only ``PROBIT`` as its post-transform, and a binary ``LinearClassifier``
(one coefficient row, two class labels) returns ``[1 - p, p]``. Where
onnxruntime's result is undefined (``PROBIT`` on that binary case) or it reads
malformed attributes silently (too many coefficients, intercepts of the wrong
length), the node is refused instead, by name. What onnxruntime's kernels refuse
is refused too, naming the node: an ArrayFeatureExtractor index out of range
or none, a NaN fed to Binarizer (after the run, when only the run knows it), a
scalar X where features are read along the last axis. Where onnxruntime reads
repeated keys (LabelEncoder: the first value; OneHotEncoder: the last column),
so does this module.

Nothing here holds strings: ``classlabels_strings``, a string tensor and
``ZipMap`` (a sequence of maps) are refused with what to do instead
(:data:`ADVICE`, ``STRINGS_ADVICE``).

Example:
  >>> import numpy as np
  >>> from onnx import helper
  >>> from onnx_optax import backend
  >>> node = helper.make_node("Normalizer", ["X"], ["Y"], domain="ai.onnx.ml", norm="L1")
  >>> (y,) = backend.run_node(node, [np.array([[1.0, 3.0], [0.0, 0.0]], np.float32)])
  >>> print(y)
  [[0.25 0.75]
   [0.   0.  ]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx_optax._src.onnx_tensors import STRINGS_ADVICE, refuse_narrowing
from onnx_optax._src.ops.arrays import check_at_run, check_size, xp_of
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.ml_scores import (
    FEATURES,
    ML_DOMAIN,
    check_dtype,
    feature_rows,
    first_max,
    post_transform,
    post_transform_of,
)
from onnx_optax._src.ops.registry import Node
from onnx_optax._src.ops.values import is_static

# Ops of ai.onnx.ml that XLA cannot run, with what to do instead (unsupported_error adds it).
ADVICE = {
    "ZipMap": (
        "ZipMap returns a sequence of maps (one dict per row), which XLA cannot hold; export "
        "the classifier without it to get the probabilities as a [N, classes] tensor (skl2onnx: "
        "to_onnx(model, X, options={id(model): {'zipmap': False}}))"
    ),
}

_F32 = np.float32


# ----------------------------------------------------------------------------- helpers


def _not_scalar(node: Node, x: Any) -> None:
    """onnxruntime refuses a scalar X where it reads features along the last axis."""
    if not np.ndim(x):
        raise ValueError(f"{node.where}: input X is a scalar; it must have at least one axis")


def _floats(node: Node, name: str) -> np.ndarray:
    """A FLOATS attribute as float32 (empty when absent)."""
    return np.asarray(node.get(name, []), _F32).reshape(-1)


def _affine(x: Any, coefficients: np.ndarray, intercepts: np.ndarray) -> Any:
    """``x @ W.T + intercepts``, W the coefficients as rows of x's width, in float32.

    Full precision on every backend (no TF32): a label must not flip with the device.
    """
    w = jnp.asarray(coefficients.reshape(-1, x.shape[1]))
    scores = jnp.matmul(x, w.T, precision=lax.Precision.HIGHEST)
    return scores + jnp.asarray(intercepts) if intercepts.size else scores


# ----------------------------------------------------------------------------- ops


@register("ArrayFeatureExtractor", domain=ML_DOMAIN)
def _array_feature_extractor(node: Node, x: Any, indices: Any) -> Any:
    """``X[..., Y]`` with Y flattened; a vector X gives one row ``[1, len(Y)]``.

    As onnxruntime, each index must lie in ``[0, X.shape[-1])`` and Y must hold
    one at least: indices known when the graph is compiled are checked then,
    the others after the run (an error naming the node, never a NaN).
    """
    check_dtype(node, x, "X", FEATURES)
    if not np.issubdtype(np.dtype(indices.dtype), np.integer):
        raise TypeError(f"{node.where}: input Y has dtype {indices.dtype}; it must be int64")
    _not_scalar(node, x)
    if not np.size(indices):
        raise ValueError(f"{node.where}: input Y is empty; it must hold one index at least")
    width = x.shape[-1]
    flat = indices.reshape(-1)
    shape = (1, flat.size) if np.ndim(x) == 1 else (*x.shape[:-1], flat.size)
    check_at_run(
        f"{node.where}: input Y holds {{}}, outside [0, {width}) (the last axis of X)",
        (flat < 0) | (flat >= width),
        flat,
    )
    if is_static(indices) and is_static(x):
        return np.take(x, flat, axis=-1).reshape(shape)
    return jnp.take(jnp.asarray(x), flat, axis=-1, mode="clip").reshape(shape)


def _scaler_check(node: Node) -> None:
    scale, offset = _floats(node, "scale"), _floats(node, "offset")
    if not scale.size or scale.size != offset.size:
        raise ValueError(
            f"{node.where}: scale and offset must have the same, non-zero length (1 or the "
            f"number of features), got {scale.size} and {offset.size}"
        )


@register("Scaler", domain=ML_DOMAIN, check=_scaler_check)
def _scaler(node: Node, x: Any) -> Any:
    """``(X - offset) * scale`` per feature (the last axis of ``[N, C]`` or ``[C]``), as float."""
    _scaler_check(node)
    check_dtype(node, x, "X", FEATURES)
    _not_scalar(node, x)
    scale, offset = _floats(node, "scale"), _floats(node, "offset")
    rank = np.ndim(x)
    if scale.size > 1 and (rank not in (1, 2) or x.shape[-1] != scale.size):
        raise ValueError(
            f"{node.where}: scale and offset have {scale.size} values, one per feature, but X "
            f"has shape {list(np.shape(x))}; X must be [N, {scale.size}] or [{scale.size}] "
            "(or scale and offset one value each)"
        )
    x = jnp.asarray(x)
    # double stays double until the end (as in onnxruntime); integers become float
    wide = x.dtype if x.dtype == np.float64 else np.dtype(_F32)
    x = x.astype(wide)
    return ((x - offset.astype(wide)) * scale.astype(wide)).astype(_F32)


def _normalizer_check(node: Node) -> None:
    if node["norm"] not in ("MAX", "L1", "L2"):
        raise ValueError(f"{node.where}: norm {node['norm']!r} is not one of MAX, L1, L2")


@register("Normalizer", domain=ML_DOMAIN, check=_normalizer_check)
def _normalizer(node: Node, x: Any) -> Any:
    """Each row divided by its MAX (largest value), L1 or L2 norm; a zero norm leaves it.

    ``MAX`` is the largest value, not the largest magnitude (onnxruntime; NaN
    skipped). ``L2`` is ``sign(x) * sqrt(x**2 / sum(x**2))``. The output is float.
    """
    _normalizer_check(node)
    check_dtype(node, x, "X", FEATURES)
    if np.ndim(x) not in (1, 2):
        raise ValueError(
            f"{node.where}: input X has shape {list(np.shape(x))}; it must be [N, C] or [C]"
        )
    x = jnp.asarray(x)
    xf = x.astype(_F32)
    norm = node["norm"]
    if norm == "MAX":
        peak = jnp.max(jnp.where(jnp.isnan(xf), -jnp.inf, xf), axis=-1, keepdims=True)
        peak = jnp.maximum(peak, np.finfo(_F32).min)  # the lowest float when all are NaN
        return jnp.where(peak != 0, xf / peak, xf)
    if norm == "L1":
        total = jnp.sum(jnp.abs(x).astype(_F32), axis=-1, keepdims=True)
        return jnp.where(total != 0, xf / total, xf)
    squares = (x * x).astype(_F32) if jnp.issubdtype(x.dtype, jnp.floating) else xf * xf
    total = jnp.sum(squares, axis=-1, keepdims=True)
    root = jnp.sqrt(squares / total)
    return jnp.where(total != 0, jnp.where(x < 0, -root, root), xf)


def _regressor_check(node: Node) -> None:
    targets = int(node["targets"])
    coefficients, intercepts = _floats(node, "coefficients"), _floats(node, "intercepts")
    if targets < 1:
        raise ValueError(f"{node.where}: targets is {targets}; it must be at least 1")
    if not coefficients.size or coefficients.size % targets:
        raise ValueError(
            f"{node.where}: {coefficients.size} coefficients are no whole number of rows for "
            f"{targets} target(s)"
        )
    if intercepts.size not in (0, targets):
        raise ValueError(
            f"{node.where}: {intercepts.size} intercepts for {targets} target(s); give one per "
            "target, or none"
        )
    post_transform_of(node)


@register("LinearRegressor", domain=ML_DOMAIN, check=_regressor_check)
def _linear_regressor(node: Node, x: Any) -> Any:
    """``X @ coefficients.reshape(targets, C).T + intercepts``, then the post-transform."""
    _regressor_check(node)
    rows = feature_rows(node, x)
    coefficients, intercepts = _floats(node, "coefficients"), _floats(node, "intercepts")
    targets = int(node["targets"])
    if coefficients.size != targets * rows.shape[1]:
        raise ValueError(
            f"{node.where}: {targets} target(s) of X's {rows.shape[1]} features need "
            f"{targets * rows.shape[1]} coefficients, got {coefficients.size}"
        )
    scores = _affine(rows, coefficients, intercepts)
    return post_transform(scores, post_transform_of(node))


def _classifier_labels(node: Node, features: int | None = None) -> np.ndarray:
    """The class labels (int64), after checking the classifier's attributes.

    The classes are counted by the intercepts, else by the coefficient rows (which
    needs the number of features, known once X is).
    """
    ints, strings = node.get("classlabels_ints", []), node.get("classlabels_strings", [])
    if len(ints) and len(strings):
        raise ValueError(
            f"{node.where}: sets both classlabels_ints and classlabels_strings; exactly one "
            "of them names the classes"
        )
    if len(strings):
        raise TypeError(
            f"{node.where}: its classes are strings (classlabels_strings), so its label "
            f"output would be a string tensor; {STRINGS_ADVICE}"
        )
    if not len(ints):
        raise ValueError(
            f"{node.where}: sets neither classlabels_ints nor classlabels_strings; exactly one "
            "of them must name the classes"
        )
    labels = np.asarray(ints, np.int64)
    transform = post_transform_of(node)
    coefficients, intercepts = _floats(node, "coefficients"), _floats(node, "intercepts")
    classes = intercepts.size or (coefficients.size // features if features else 0)
    if features and (not classes or coefficients.size != classes * features):
        rows = f"{classes} rows (one per intercept)" if intercepts.size else "whole rows"
        raise ValueError(
            f"{node.where}: its {coefficients.size} coefficients do not make {rows} of X's "
            f"{features} features"
        )
    if classes == 1:
        if len(labels) != 2:
            raise ValueError(
                f"{node.where}: one coefficient row (a binary classifier) needs exactly 2 class "
                f"labels, got {len(labels)}"
            )
        if transform == "PROBIT":
            raise ValueError(
                f"{node.where}: post_transform PROBIT on one coefficient row has no defined "
                "second column (onnxruntime leaves it unwritten); export one coefficient row "
                "per class, or another post_transform"
            )
    elif classes and len(labels) != classes:
        raise ValueError(
            f"{node.where}: {len(labels)} class labels for {classes} classes; give one label "
            "per class"
        )
    return labels


def _classifier_check(node: Node) -> None:
    coefficients, intercepts = _floats(node, "coefficients"), _floats(node, "intercepts")
    if not coefficients.size or coefficients.size % max(intercepts.size, 1):
        raise ValueError(
            f"{node.where}: its {coefficients.size} coefficients do not make whole rows, one "
            f"per class ({intercepts.size} intercepts)"
        )
    _classifier_labels(node)
    if not intercepts.size:  # onnxruntime counts the classes by them, and refuses none
        raise ValueError(
            f"{node.where}: intercepts is empty; a LinearClassifier gives one per class "
            "(one for a binary classifier of one coefficient row)"
        )


@register("LinearClassifier", domain=ML_DOMAIN, check=_classifier_check)
def _linear_classifier(node: Node, x: Any) -> tuple[Any, Any]:
    """Labels ``[N]`` and scores ``[N, classes]`` of a linear model.

    The label is the class of the largest raw score (before the post-transform);
    with one coefficient row (binary), the second label when the score is
    positive, else the first, and the scores are ``[1 - p, p]`` where ``p`` is
    the score after a LOGISTIC post-transform, else the raw score
    (onnxruntime's convention).
    """
    rows = feature_rows(node, x)
    labels = _classifier_labels(node, rows.shape[1])
    refuse_narrowing(f"{node.where}: classlabels_ints", labels)  # as 32-bit JAX computes
    coefficients, intercepts = _floats(node, "coefficients"), _floats(node, "intercepts")
    scores = _affine(rows, coefficients, intercepts)
    transform = post_transform_of(node)
    table = jnp.asarray(labels)
    if scores.shape[1] == 1:
        score = scores[:, 0]
        label = jnp.where(score > 0, table[1], table[0])
        p = jax.nn.sigmoid(score) if transform == "LOGISTIC" else score
        return label, jnp.stack([1 - p, p], axis=1)
    return jnp.take(table, first_max(scores)), post_transform(scores, transform)


@register("Binarizer", domain=ML_DOMAIN)
def _binarizer(node: Node, x: Any) -> Any:
    """``1 if x > threshold else 0``, elementwise, in x's dtype (a NaN fails, as in onnxruntime).

    For integer X the comparison is exact: ``x > floor(threshold)``.
    """
    check_dtype(node, x, "X", FEATURES)
    threshold = float(node["threshold"])
    if np.dtype(x.dtype).kind == "f":  # onnxruntime refuses a NaN ("is NaN"), never a 0 for it
        check_at_run(f"{node.where}: input X holds {{}}, which is no number", xp_of(x).isnan(x), x)
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.integer):
        if math.isnan(threshold) or math.isinf(threshold):  # nothing is above NaN or inf
            return jnp.full(x.shape, int(threshold == -math.inf), x.dtype)
        info = jnp.iinfo(x.dtype)
        edge = math.floor(threshold)
        if edge >= info.max or edge < info.min:
            return jnp.full(x.shape, 0 if edge >= info.max else 1, x.dtype)
        above = x > np.asarray(edge, x.dtype)
    else:
        above = x > np.asarray(threshold, x.dtype)
    return above.astype(x.dtype)


# ----------------------------------------------------------------------------- encoders


def _tensor_or_list(node: Node, tensor: str, names: Sequence[tuple[str, Any]]) -> np.ndarray | None:
    """The first of a TENSOR attribute and lists (``(name, dtype)``) that is given, or None."""
    value = node.get(tensor)
    if value is not None:
        return np.asarray(value).reshape(-1)
    for name, dtype in names:
        items = node.get(name)
        if items is not None and len(items):
            return np.asarray(items, dtype).reshape(-1)
    return None


def _label_encoder_table(node: Node) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keys, values and the default (a 1-element array of the values' dtype)."""
    strings = [n for n in ("classes_strings", "keys_strings", "values_strings") if node.get(n)]
    for name in ("keys_tensor", "values_tensor", "default_tensor"):
        value = node.get(name)
        if value is not None and np.asarray(value).dtype.kind in "OUS":
            strings.append(name)
    if strings or node.opset < 2:
        raise ValueError(
            f"{node.where}: maps strings ({', '.join(strings) or 'LabelEncoder opset 1'}); "
            f"{STRINGS_ADVICE}"
        )
    keys = _tensor_or_list(node, "keys_tensor", [("keys_floats", _F32), ("keys_int64s", np.int64)])
    values = _tensor_or_list(
        node, "values_tensor", [("values_floats", _F32), ("values_int64s", np.int64)]
    )
    if keys is None or values is None or keys.size != values.size:
        raise ValueError(
            f"{node.where}: needs keys and values of one length, got "
            f"{0 if keys is None else keys.size} and {0 if values is None else values.size}"
        )
    # a repeated key maps to its first value (onnxruntime's map keeps the first insert)
    nan = np.isnan(keys) if keys.dtype.kind == "f" else np.zeros(keys.size, bool)
    _, first = np.unique(keys[~nan], return_index=True)
    kept = np.sort(np.concatenate([np.flatnonzero(~nan)[first], np.flatnonzero(nan)[:1]]))
    keys, values = keys[kept], values[kept]
    given = node.get("default_tensor")
    if given is not None:
        if np.size(given) != 1:
            raise ValueError(
                f"{node.where}: default_tensor has {np.size(given)} values; it must hold one"
            )
        default = np.asarray(given).reshape(-1).astype(values.dtype)
    elif values.dtype.kind == "f":
        default = np.asarray([node.get("default_float", -0.0)], values.dtype)
    else:
        default = np.asarray([node.get("default_int64", -1)], values.dtype)
    return keys, values, default


def _label_encoder_check(node: Node) -> None:
    _label_encoder_table(node)


@register("LabelEncoder", domain=ML_DOMAIN, check=_label_encoder_check)
def _label_encoder(node: Node, x: Any) -> Any:
    """Each element of X replaced by the value of its key, else by the default.

    Numeric keys and values only (opset 2's lists, opset 4's tensors); a NaN
    key matches a NaN (as onnxruntime). The keys are sorted once, so each
    element is one binary search (``searchsorted``).
    """
    keys, values, default = _label_encoder_table(node)
    if (np.dtype(x.dtype).kind == "f") != (keys.dtype.kind == "f"):
        raise TypeError(
            f"{node.where}: input X has dtype {np.dtype(x.dtype)} but its keys are "
            f"{keys.dtype}; both must be floats or both integers"
        )
    refuse_narrowing(f"{node.where}: keys", keys)
    refuse_narrowing(f"{node.where}: values", values)
    held = keys.astype(x.dtype) == keys  # a key X's dtype cannot hold matches nothing
    if keys.dtype.kind == "f":
        held |= np.isnan(keys)
    keys, values = keys[held].astype(x.dtype), values[held]
    if not keys.size:
        return jnp.full(np.shape(x), jnp.asarray(default)[0])
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]  # NaN keys sort last
    x = jnp.asarray(x)
    at = jnp.clip(jnp.searchsorted(jnp.asarray(keys), x), 0, keys.size - 1)
    found = jnp.asarray(keys)[at] == x
    if keys.dtype.kind == "f" and np.isnan(keys).any():
        found = found | jnp.isnan(x)
        at = jnp.where(jnp.isnan(x), keys.size - 1, at)
    return jnp.where(found, jnp.asarray(values)[at], jnp.asarray(default)[0])


def _imputer_values(node: Node) -> tuple[np.ndarray, Any]:
    """The imputed values and the value they replace (float or int64 attributes)."""
    floats, ints = node.get("imputed_value_floats") or [], node.get("imputed_value_int64s") or []
    if bool(len(floats)) == bool(len(ints)):
        raise ValueError(
            f"{node.where}: exactly one of imputed_value_floats and imputed_value_int64s must "
            f"be given, got {len(floats)} and {len(ints)} values"
        )
    if len(floats):
        return np.asarray(floats, _F32), np.float32(node.get("replaced_value_float", 0.0))
    return np.asarray(ints, np.int64), np.int64(node.get("replaced_value_int64", 0))


def _imputer_check(node: Node) -> None:
    _imputer_values(node)


@register("Imputer", domain=ML_DOMAIN, check=_imputer_check)
def _imputer(node: Node, x: Any) -> Any:
    """``where(X == replaced_value, imputed, X)``; a NaN replaced value matches NaNs.

    One imputed value for all, or one per feature (X's last axis, X ``[N, C]``
    or ``[C]``); float attributes for float X, int64 ones for integer X.
    """
    imputed, replaced = _imputer_values(node)
    check_dtype(node, x, "X", FEATURES)
    _not_scalar(node, x)
    is_float = np.dtype(x.dtype).kind == "f"
    if is_float != (imputed.dtype.kind == "f"):
        raise TypeError(
            f"{node.where}: input X has dtype {np.dtype(x.dtype)} but the imputed values are "
            f"{'floats' if imputed.dtype.kind == 'f' else 'int64s'}; give imputed_value_"
            f"{'floats' if is_float else 'int64s'} for it"
        )
    if imputed.size > 1 and (np.ndim(x) not in (1, 2) or x.shape[-1] != imputed.size):
        raise ValueError(
            f"{node.where}: {imputed.size} imputed values, one per feature, but X has shape "
            f"{list(np.shape(x))}"
        )
    x = jnp.asarray(x)
    refuse_narrowing(f"{node.where}: imputed values", imputed)
    fill = jnp.asarray(imputed, x.dtype)
    hit = jnp.isnan(x) if is_float and np.isnan(replaced) else x == jnp.asarray(replaced, x.dtype)
    return jnp.where(hit, fill if imputed.size > 1 else fill[0], x)


def _one_hot_categories(node: Node) -> np.ndarray:
    if node.get("cats_strings"):
        raise ValueError(
            f"{node.where}: its categories are strings (cats_strings); {STRINGS_ADVICE}"
        )
    cats = np.asarray(node.get("cats_int64s") or [], np.int64)
    if not cats.size:
        raise ValueError(f"{node.where}: cats_int64s is empty; it must list the categories")
    return cats


def _one_hot_check(node: Node) -> None:
    _one_hot_categories(node)


@register("OneHotEncoder", domain=ML_DOMAIN, check=_one_hot_check)
def _one_hot_encoder(node: Node, x: Any) -> Any:
    """``Y[..., k] = (X == cats_int64s[k])`` as float32, shape ``X.shape + [len(cats)]``.

    A float X is compared after truncation to int64 (as onnxruntime). With
    ``zeros=0`` a value in no category is an error, raised after the run.
    """
    cats = _one_hot_categories(node)
    check_dtype(node, x, "X", FEATURES)
    refuse_narrowing(f"{node.where}: cats_int64s", cats)
    check_size(node, (*np.shape(x), cats.size), _F32)
    x = jnp.asarray(x)
    values = x.astype(cats.dtype) if np.dtype(x.dtype).kind == "f" else x
    table = jnp.asarray(cats).astype(values.dtype)
    # a repeated category marks only its last column (onnxruntime's map keeps the last)
    last = {int(c): i for i, c in enumerate(cats)}
    kept = np.zeros(cats.size, bool)
    kept[list(last.values())] = True
    hits = (values[..., None] == table) & kept
    if not int(node["zeros"]):
        unknown = ~jnp.any(hits, axis=-1)
        check_at_run(
            f"{node.where}: input X holds {{}}, which is in no category (zeros=0)", unknown, values
        )
    return hits.astype(_F32)
