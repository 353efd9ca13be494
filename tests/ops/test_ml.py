"""The ai.onnx.ml ops on scikit-learn exports and single nodes; expected values from onnxruntime.

Every value compared comes from onnxruntime running the same model, never from
onnx_optax: real scikit-learn models exported by skl2onnx, then one node per
post-transform, norm and input type built with ``onnx.helper``. The refusals
(ZipMap, string labels, attributes onnxruntime reads loosely) are checked by
the node they name.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("skl2onnx")
from onnx import TensorProto, helper  # noqa: E402
from skl2onnx import to_onnx  # noqa: E402
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge  # noqa: E402
from sklearn.neural_network import MLPClassifier  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import Normalizer, StandardScaler  # noqa: E402
from sklearn.svm import LinearSVC  # noqa: E402

from onnx_optax import backend  # noqa: E402
from onnx_optax.backend import UnsupportedOperatorError  # noqa: E402
from tests.support.builders import onnxruntime_outputs  # noqa: E402

ML = "ai.onnx.ml"
F32, F64, I32, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32, TensorProto.INT64
TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")

_rng = np.random.default_rng(0)
X = _rng.normal(size=(24, 4)).astype(np.float32)
Y2 = (X[:, 0] + 0.3 * X[:, 1] > 0).astype(np.int64)
Y3 = Y2 + (X[:, 2] > 0.4)


def assert_same(name: str, ours: np.ndarray, theirs: np.ndarray) -> None:
    """Same dtype and shape; integers equal, floats within float32 rounding (NaN where NaN)."""
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, (
        name,
        (ours.dtype, ours.shape),
        (theirs.dtype, theirs.shape),
    )
    if np.issubdtype(theirs.dtype, np.integer):
        np.testing.assert_array_equal(ours, theirs, err_msg=name)
    else:
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6, err_msg=name)


def assert_as_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> None:
    """Every output of ``model`` on ``feeds``: same dtype, shape and values as onnxruntime's."""
    ours = list(backend.prepare(model).run(dict(feeds)))
    theirs = onnxruntime_outputs(model, feeds)
    assert len(ours) == len(theirs)
    for name, a, b in zip([o.name for o in model.graph.output], ours, theirs, strict=True):
        assert_same(name, a, b)


def exported(estimator: Any, y: Any, **options: Any) -> onnx.ModelProto:
    """``estimator`` fitted on (X, y) and exported by skl2onnx (warnings of the fit muted)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning on 24 rows; skl2onnx's notices
        estimator.fit(X, y)
        last = estimator.steps[-1][1] if hasattr(estimator, "steps") else estimator
        kwargs = {"options": {id(last): options}} if options else {}
        return to_onnx(estimator, X[:1], **kwargs)


def node_model(
    nodes: onnx.NodeProto | Sequence[onnx.NodeProto],
    inputs: Sequence[tuple[Any, ...]],
    outputs: Sequence[tuple[Any, ...]],
    *,
    initializers: Sequence[onnx.TensorProto] = (),
    ml_opset: int = 1,
) -> onnx.ModelProto:
    """A model of its nodes; inputs and outputs are (name, element type[, rank, default 2])."""

    def info(name: str, elem: int, rank: int = 2) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, [None] * rank)

    graph = helper.make_graph(
        [nodes] if isinstance(nodes, onnx.NodeProto) else list(nodes),
        "g",
        [info(*i) for i in inputs],
        [info(*o) for o in outputs],
        initializer=list(initializers),
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(ML, ml_opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def ml_node(op: str, inputs: Sequence[str], outputs: Sequence[str], **attrs: Any) -> Any:
    return helper.make_node(op, list(inputs), list(outputs), domain=ML, name="n", **attrs)


# ----------------------------------------------------------------------------- scikit-learn


SKLEARN: dict[str, Callable[[], onnx.ModelProto]] = {
    "logistic_binary": lambda: exported(LogisticRegression(), Y2, zipmap=False),
    "logistic_multiclass": lambda: exported(LogisticRegression(), Y3, zipmap=False),
    "linear_regression": lambda: exported(LinearRegression(), X @ [1.0, -2.0, 0.5, 0.0]),
    "ridge_two_targets": lambda: exported(Ridge(alpha=0.5), X[:, :2] * [3.0, -1.0] + 1.0),
    "scaler_logistic": lambda: exported(
        make_pipeline(StandardScaler(), LogisticRegression()), Y3, zipmap=False
    ),
    "normalizer_l2_regression": lambda: exported(
        make_pipeline(Normalizer(), LinearRegression()), X[:, 0]
    ),
    "normalizer_max_logistic": lambda: exported(
        make_pipeline(Normalizer(norm="max"), LogisticRegression()), Y2, zipmap=False
    ),
    "mlp_multiclass": lambda: exported(
        MLPClassifier(hidden_layer_sizes=(8,), max_iter=50, random_state=0), Y3, zipmap=False
    ),
    "linear_svc_multiclass": lambda: exported(LinearSVC(), Y3),
    "linear_svc_binary": lambda: exported(LinearSVC(), Y2),
}


@pytest.mark.parametrize("name", sorted(SKLEARN))
def test_sklearn_export_runs_as_in_onnxruntime(name: str) -> None:
    model = SKLEARN[name]()
    assert any(node.domain == ML for node in model.graph.node)
    assert_as_onnxruntime(model, {"X": X})


def test_zipmap_is_refused_with_what_to_do() -> None:
    model = exported(LogisticRegression(), Y3)  # skl2onnx's default: probabilities as ZipMap
    with pytest.raises(UnsupportedOperatorError) as info:
        backend.prepare(model)
    message = str(info.value)
    assert "(ai.onnx.ml.ZipMap)" in message and "sequence of maps" in message
    assert "options={id(model): {'zipmap': False}}" in message


@pytest.mark.parametrize(
    ("estimator", "node"),
    [
        (LogisticRegression(), r"node 'LinearClassifier' \(ai.onnx.ml.LinearClassifier\)"),
        (
            MLPClassifier(hidden_layer_sizes=(4,), max_iter=5, random_state=0),
            r"node 'ArrayFeatureExtractor' \(ai.onnx.ml.ArrayFeatureExtractor\)",
        ),
    ],
)
def test_string_class_labels_are_refused_by_node(estimator: Any, node: str) -> None:
    model = exported(estimator, np.where(Y2 == 1, "yes", "no"), zipmap=False)
    with pytest.raises(TypeError, match=rf"{node}: .*string.*LabelEncoder"):
        backend.prepare(model)


# ----------------------------------------------------------------------------- single nodes

COEFFICIENTS = [0.5, -1.0, 0.25, 1.5, 0.0, -0.5, 2.0, 1.0, -1.5, 0.75, 0.5, 0.0]
INTERCEPTS = [0.1, -0.2, 0.3]
# rows: ordinary, zeros (SOFTMAX_ZERO's all-zero row), scores inside (0, 1) for PROBIT
FEATURES = np.array(
    [[1.0, 2.0, -1.0, 0.5], [0.0, 0.0, 0.0, 0.0], [0.1, 0.2, 0.05, 0.1], [-2.0, 1.0, 3.0, -0.5]],
    np.float32,
)
# rows: negative maximum, zeros, mixed signs
NORMALIZED = np.array([[-1, -2, 0], [0, 0, 0], [3, -4, 1], [2, 2, -7]], np.float32)
# feed of each group: X, its element type; a vector is read as one row
FEEDS = {
    "features": (FEATURES, F32),
    "features_int64": (np.array([[1, -2, 3, 0], [4, 0, -1, 2]], np.int64), I64),
    "features_int32": (np.array([[1, -2, 3, 0], [4, 0, -1, 2]], np.int32), I32),
    "features_vector": (FEATURES[0], F32),
    **{
        f"normalized_{t}": (NORMALIZED.astype(t), e)
        for t, e in (("float32", F32), ("int64", I64), ("int32", I32))
    },
    **{f"vector_{t}": (NORMALIZED[2].astype(t), e) for t, e in (("float32", F32), ("int64", I64))},
}


def classifier_attrs(transform: str, rows: int = 3) -> dict[str, Any]:
    return {
        "coefficients": COEFFICIENTS[: 4 * rows],
        "intercepts": [0.0] * rows if transform == "SOFTMAX_ZERO" else INTERCEPTS[:rows],
        "classlabels_ints": [3, 5, 9] if rows == 3 else [4, 7],
        "post_transform": transform,
    }


def classifier(transform: str, *, rows: int = 3, elem: int = F32, **attrs: Any) -> Any:
    """A model of one LinearClassifier node named 'n'."""
    attrs = {**classifier_attrs(transform, rows), **attrs}
    node = ml_node("LinearClassifier", ["X"], ["label", "scores"], **attrs)
    return node_model(node, [("X", elem)], [("label", I64, 1), ("scores", F32)])


def _cases() -> dict[str, tuple[str, str, dict[str, Any], int]]:
    """case -> (feed group, op, attributes, rank of the (last) output)."""
    cases: dict[str, tuple[str, str, dict[str, Any], int]] = {}
    for t in TRANSFORMS:
        cases[f"classifier_{t}"] = ("features", "LinearClassifier", classifier_attrs(t), 2)
        if t != "PROBIT":  # refused: see REFUSED["probit_one_row"]
            attrs = classifier_attrs(t, rows=1)
            cases[f"classifier_one_row_{t}"] = ("features", "LinearClassifier", attrs, 2)
        for targets in (1, 2):
            attrs = {
                "coefficients": [0.1, 0.2, -0.05, 0.3, 0.0, 0.25, 0.1, -0.2][: 4 * targets],
                "intercepts": [0.3, 0.1][:targets],
                "targets": targets,
                "post_transform": t,
            }
            cases[f"regressor_{targets}_targets_{t}"] = ("features", "LinearRegressor", attrs, 2)
    cases["regressor_no_intercepts"] = (
        "features",
        "LinearRegressor",
        {"coefficients": [1.0, -1.0, 2.0, 0.5]},
        2,
    )
    for group in ("features_int64", "features_int32", "features_vector"):
        cases[f"classifier_{group}"] = (group, "LinearClassifier", classifier_attrs("SOFTMAX"), 2)
    for group in ("normalized_float32", "normalized_int64", "normalized_int32"):
        for norm in ("MAX", "L1", "L2"):
            cases[f"normalizer_{norm}_{group}"] = (group, "Normalizer", {"norm": norm}, 2)
    for group in ("vector_float32", "vector_int64"):
        for norm in ("MAX", "L1", "L2"):
            cases[f"normalizer_{norm}_{group}"] = (group, "Normalizer", {"norm": norm}, 1)
    for group in ("normalized_float32", "normalized_int64"):
        per_feature = {"offset": [1.0, 0.5, -2.0], "scale": [2.0, 3.0, 0.25]}
        cases[f"scaler_per_feature_{group}"] = (group, "Scaler", per_feature, 2)
        cases[f"scaler_one_value_{group}"] = (
            group,
            "Scaler",
            {"offset": [0.5], "scale": [-1.5]},
            2,
        )
    return cases


NODE_CASES = _cases()


@functools.cache
def group_outputs(group: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each output of the group's nodes, (ours, onnxruntime's): one model, one compilation."""
    x, elem = FEEDS[group]
    nodes, outputs = [], []
    for case, (of, op, attrs, rank) in NODE_CASES.items():
        if of != group:
            continue
        if op == "LinearClassifier":
            names = [f"{case}.label", f"{case}.scores"]
            outputs += [(names[0], I64, 1), (names[1], F32, rank)]
        else:
            names = [f"{case}.Y"]
            outputs.append((names[0], F32, rank))
        nodes.append(helper.make_node(op, ["X"], names, domain=ML, name=case, **attrs))
    model = node_model(nodes, [("X", elem, x.ndim)], outputs)
    ours = backend.prepare(model).run({"X": x})
    theirs = onnxruntime_outputs(model, {"X": x})
    return {name: (a, b) for (name, *_), a, b in zip(outputs, ours, theirs, strict=True)}


@pytest.mark.parametrize("case", sorted(NODE_CASES))
def test_node_as_in_onnxruntime(case: str) -> None:
    """One node per post-transform, norm, input type and rank (compiled a group at a time)."""
    found = {
        k: v for k, v in group_outputs(NODE_CASES[case][0]).items() if k.startswith(case + ".")
    }
    assert found
    for name, (ours, theirs) in found.items():
        assert_same(name, ours, theirs)


def test_linear_classifier_reads_double_features_in_float32() -> None:
    model = classifier("NONE", elem=F64)
    with jax.enable_x64(True):
        assert_as_onnxruntime(model, {"X": FEATURES.astype(np.float64) / 3})


def test_linear_classifier_labels_beyond_int32_need_64_bit_jax() -> None:
    model = classifier("NONE", classlabels_ints=[2**40, 7, -(2**35)])
    with pytest.raises(ValueError, match=r"node 'n' .*classlabels_ints .*64-bit JAX"):
        backend.prepare(model).run({"X": FEATURES})
    with jax.enable_x64(True):
        assert_as_onnxruntime(model, {"X": FEATURES})


@pytest.mark.parametrize("ml_opset", [1, 5])
def test_attributes_default_to_the_ml_schema(ml_opset: int) -> None:
    """Normalizer without ``norm`` is MAX, the ai.onnx.ml schema's default at every opset."""
    model = node_model(
        ml_node("Normalizer", ["X"], ["Y"]), [("X", F32)], [("Y", F32)], ml_opset=ml_opset
    )
    assert_as_onnxruntime(model, {"X": NORMALIZED})


# ----------------------------------------------------------------------------- ArrayFeatureExtractor


@pytest.mark.parametrize(
    "shape", [(4, 5), (2, 3, 5), (5,)], ids=["matrix", "three_axes", "vector_one_row"]
)
def test_array_feature_extractor_with_fed_indices(shape: tuple[int, ...]) -> None:
    model = node_model(
        ml_node("ArrayFeatureExtractor", ["X", "I"], ["Z"]),
        [("X", F32, len(shape)), ("I", I64, 1)],
        [("Z", F32, max(len(shape), 2))],
    )
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    assert_as_onnxruntime(model, {"X": x, "I": np.array([4, 0, 4, 2], np.int64)})


def test_array_feature_extractor_of_stored_int64_classes() -> None:
    """skl2onnx's label branch: classes (an initializer) at the argmax of the scores."""
    classes = helper.make_tensor("classes", I64, [3], [10, -4, 2**31 - 1])
    model = node_model(
        ml_node("ArrayFeatureExtractor", ["classes", "I"], ["Z"]),
        [("I", I64)],
        [("Z", I64)],
        initializers=[classes],
    )
    assert_as_onnxruntime(model, {"I": np.array([[2, 0, 1, 1]], np.int64)})


def test_array_feature_extractor_stored_index_out_of_range() -> None:
    index = helper.make_tensor("I", I64, [2], [1, 5])
    model = node_model(
        ml_node("ArrayFeatureExtractor", ["X", "I"], ["Z"]),
        [("X", F32)],
        [("Z", F32)],
        initializers=[index],
    )
    with pytest.raises(ValueError, match=r"node 'n' .*input Y holds 5, outside \[0, 3\)"):
        backend.prepare(model).run({"X": np.ones((2, 3), np.float32)})


def afe_model() -> onnx.ModelProto:
    return node_model(
        ml_node("ArrayFeatureExtractor", ["X", "I"], ["Z"]),
        [("X", F32), ("I", I64, 1)],
        [("Z", F32)],
    )


@pytest.mark.parametrize("index", [[1, 3], [-1, 0]], ids=["past_the_end", "negative"])
def test_array_feature_extractor_fed_index_out_of_range_fails_after_the_run(
    index: list[int],
) -> None:
    """As onnxruntime ("index is out of range"): an error naming the node, never NaN."""
    feeds = {"X": np.ones((2, 3), np.float32), "I": np.array(index, np.int64)}
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match="out of range"):
        onnxruntime_outputs(afe_model(), feeds)
    bad = index[1] if index[1] == 3 else index[0]
    with pytest.raises(ValueError, match=rf"node 'n' .*Y holds {bad}, outside \[0, 3\)"):
        backend.prepare(afe_model()).run(feeds)


def test_array_feature_extractor_of_no_index_is_refused() -> None:
    feeds = {"X": np.ones((2, 3), np.float32), "I": np.zeros(0, np.int64)}
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match="num_indices"):
        onnxruntime_outputs(afe_model(), feeds)
    with pytest.raises(ValueError, match=r"node 'n' .*input Y is empty"):
        backend.prepare(afe_model()).run(feeds)


def test_binarizer_of_a_nan_fails_after_the_run_as_in_onnxruntime() -> None:
    """onnxruntime: "Input data with index: 1 is NaN"; never a 0 for it."""
    model = node_model(ml_node("Binarizer", ["X"], ["Y"]), [("X", F32, 1)], [("Y", F32, 1)])
    x = np.array([1.5, np.nan, 0.5], np.float32)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail, match="is NaN"):
        onnxruntime_outputs(model, {"X": x})
    with pytest.raises(ValueError, match=r"node 'n' \(ai.onnx.ml.Binarizer\): input X holds nan"):
        backend.prepare(model).run({"X": x})
    (y,) = backend.prepare(model).run({"X": np.array([1.5, np.inf, -0.5], np.float32)})
    np.testing.assert_array_equal(y, [1, 1, 0])


@pytest.mark.parametrize("threshold", [np.nan, np.inf, -np.inf, 1e30, 1.5])
def test_binarizer_of_integers_compares_with_any_threshold(threshold: float) -> None:
    """``x > threshold`` exactly, a non-finite or huge threshold included (no error)."""
    node = ml_node("Binarizer", ["X"], ["Y"], threshold=threshold)
    model = node_model(node, [("X", I64, 1)], [("Y", I64, 1)])
    x = np.array([-3, 1, 2, 7], np.int64)
    (y,) = backend.prepare(model).run({"X": x})
    np.testing.assert_array_equal(y, (x > threshold).astype(np.int64))


@pytest.mark.parametrize(
    "node",
    [
        ml_node("Scaler", ["X"], ["Y"], scale=[2.0], offset=[1.0]),
        ml_node("Imputer", ["X"], ["Y"], imputed_value_floats=[2.0]),
    ],
    ids=["Scaler", "Imputer"],
)
def test_a_scalar_x_is_refused_as_in_onnxruntime(node: onnx.NodeProto) -> None:
    """onnxruntime: "input has empty dimensions" (Scaler), "Empty input dimensions" (Imputer)."""
    model = node_model(node, [("X", F32, 0)], [("Y", F32, 0)])
    x = np.array(0.0, np.float32)
    with pytest.raises(Exception, match="mpty"):  # onnxruntime's own types
        onnxruntime_outputs(model, {"X": x})
    with pytest.raises(ValueError, match=rf"node 'n' .*{node.op_type}\): input X is a scalar"):
        backend.prepare(model).run({"X": x})


@pytest.mark.parametrize("rows", [3, 1])
def test_linear_classifier_without_intercepts_is_refused_as_in_onnxruntime(rows: int) -> None:
    """onnxruntime: "LinearClassifier: intercepts must not be empty"."""
    model = classifier("NONE", rows=rows)
    del model.graph.node[0].attribute[
        [a.name for a in model.graph.node[0].attribute].index("intercepts")
    ]
    with pytest.raises(Exception, match=r"intercepts must not be empty"):  # its own types
        onnxruntime_outputs(model, {"X": X[:, :4]})
    with pytest.raises(ValueError, match=r"node 'n' .*LinearClassifier\): intercepts is empty"):
        backend.prepare(model)


def test_one_hot_encoder_repeated_category_marks_its_last_column_as_onnxruntime() -> None:
    node = ml_node("OneHotEncoder", ["X"], ["Y"], cats_int64s=[1, 2, 1])
    model = node_model(node, [("X", I64)], [("Y", F32, 3)])
    assert_as_onnxruntime(model, {"X": np.array([[1, 2], [3, 1]], np.int64)})


# ----------------------------------------------------------------------------- refusals

REFUSED: dict[str, tuple[Any, str]] = {
    "probit_one_row": (
        classifier("PROBIT", rows=1),
        r"PROBIT on one coefficient row has no defined second column",
    ),
    "labels_count": (
        classifier("NONE", classlabels_ints=[1, 2]),
        r"2 class labels for 3 classes",
    ),
    "one_row_labels": (
        classifier("NONE", rows=1, classlabels_ints=[1, 2, 3]),
        r"one coefficient row \(a binary classifier\) needs exactly 2 class labels, got 3",
    ),
    "no_labels": (
        node_model(
            ml_node("LinearClassifier", ["X"], ["l", "s"], coefficients=[1.0, 2.0]),
            [("X", F32)],
            [("l", I64), ("s", F32)],
        ),
        r"sets neither classlabels_ints nor classlabels_strings",
    ),
    "transform": (classifier("SIGMOID"), r"post_transform 'SIGMOID' is not one of"),
    "norm": (
        node_model(ml_node("Normalizer", ["X"], ["Y"], norm="L3"), [("X", F32)], [("Y", F32)]),
        r"norm 'L3' is not one of MAX, L1, L2",
    ),
    "scaler_lengths": (
        node_model(
            ml_node("Scaler", ["X"], ["Y"], offset=[1.0, 2.0], scale=[1.0]),
            [("X", F32)],
            [("Y", F32)],
        ),
        r"scale and offset must have the same, non-zero length .*got 1 and 2",
    ),
    "regressor_intercepts": (
        node_model(
            ml_node("LinearRegressor", ["X"], ["Y"], coefficients=[1.0, 2.0], intercepts=[1.0, 2]),
            [("X", F32)],
            [("Y", F32)],
        ),
        r"2 intercepts for 1 target\(s\)",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_malformed_attributes_are_refused_at_prepare(name: str) -> None:
    model, pattern = REFUSED[name]
    with pytest.raises(ValueError, match=rf"^node 'n' \(ai.onnx.ml.\w+\): .*{pattern}"):
        backend.prepare(model)


@pytest.mark.parametrize(
    ("model", "feeds", "pattern"),
    [
        (
            classifier("NONE"),
            {"X": np.ones((2, 3), np.float32)},
            r"its 12 coefficients do not make 3 rows \(one per intercept\) of X's 3 features",
        ),
        (
            node_model(ml_node("Normalizer", ["X"], ["Y"]), [("X", F32, 3)], [("Y", F32, 3)]),
            {"X": np.ones((2, 2, 2), np.float32)},
            r"input X has shape \[2, 2, 2\]; it must be \[N, C\] or \[C\]",
        ),
        (
            node_model(
                ml_node("Scaler", ["X"], ["Y"], offset=[0.0, 1.0], scale=[1.0, 2.0]),
                [("X", F32)],
                [("Y", F32)],
            ),
            {"X": np.ones((2, 3), np.float32)},
            r"scale and offset have 2 values, one per feature, but X has shape \[2, 3\]",
        ),
    ],
    ids=["coefficients_width", "normalizer_rank", "scaler_width"],
)
def test_inputs_that_do_not_fit_are_refused_by_node(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], pattern: str
) -> None:
    with pytest.raises(ValueError, match=rf"^node 'n' \(ai.onnx.ml.\w+\): {pattern}"):
        backend.prepare(model).run(feeds)


def test_float16_features_are_refused_by_node() -> None:
    model = node_model(
        ml_node("Normalizer", ["X"], ["Y"]), [("X", TensorProto.FLOAT16)], [("Y", F32)]
    )
    with pytest.raises(
        TypeError, match=r"node 'n' .*input 'X' has dtype float16; it must be one of"
    ):
        backend.prepare(model).run({"X": np.ones((2, 2), np.float16)})


def test_cast_to_string_is_refused_at_prepare() -> None:
    node = helper.make_node("Cast", ["X"], ["Y"], to=TensorProto.STRING, name="c")
    model = node_model(node, [("X", I64)], [("Y", I64)])
    with pytest.raises(TypeError, match=r"node 'c' \(ai.onnx.Cast\): casts to STRING; XLA"):
        backend.prepare(model)


def test_unsupported_ml_ops_are_listed() -> None:
    node = ml_node("SVMRegressor", ["X"], ["Y"])
    with pytest.raises(UnsupportedOperatorError, match=r"ai.onnx.ml.SVMRegressor \(opset 1\)"):
        backend.prepare(node_model(node, [("X", F32)], [("Y", F32)]))


def test_supported_ops_list_the_ml_domain() -> None:
    assert backend.supported_ops()[ML] == [
        "ArrayFeatureExtractor",
        "Binarizer",
        "Imputer",
        "LabelEncoder",
        "LinearClassifier",
        "LinearRegressor",
        "Normalizer",
        "OneHotEncoder",
        "Scaler",
        "TreeEnsemble",
        "TreeEnsembleClassifier",
        "TreeEnsembleRegressor",
    ]
