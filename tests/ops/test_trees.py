"""The tree ensembles (ai.onnx.ml): scikit-learn exports and hand-built forests.

Expected values come from scikit-learn's own predict/predict_proba and from
onnxruntime running the same model, never from onnx_optax: forests, boosted
and decision trees exported by skl2onnx (float32, and float64 with the
``_as_tensor`` attributes), then one node per branch mode, aggregate function,
post-transform and missing-value rule built with ``onnx.helper``. Malformed
forests (string labels, unequal attribute lengths, ids out of range, a cycle)
are refused by the node they name, when the graph is prepared.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("skl2onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from skl2onnx import to_onnx  # noqa: E402
from sklearn.ensemble import (  # noqa: E402
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor  # noqa: E402

from onnx_optax import backend  # noqa: E402
from tests.support.builders import onnxruntime_outputs as _onnxruntime  # noqa: E402

ML = "ai.onnx.ml"
_rng = np.random.default_rng(0)
X = _rng.normal(size=(96, 5)).astype(np.float32)
Y2 = (X[:, 0] + X[:, 1] > 0).astype(np.int64)
Y3 = np.digitize(X[:, 0], [-0.5, 0.5]).astype(np.int64) * 3 + 1  # labels 1, 4, 7
YR = 2 * X[:, 0] + np.sin(3 * X[:, 1])


def _export(model: Any, y: Any, x: np.ndarray = X) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(X, y)
        options = {id(model): {"zipmap": False}} if hasattr(model, "predict_proba") else None
        return to_onnx(model, x[:1], options=options, target_opset={"": 17, ML: 3})


CLASSIFIERS = {
    "forest_binary": lambda: RandomForestClassifier(n_estimators=8, max_depth=6, random_state=0),
    "forest_3": lambda: RandomForestClassifier(n_estimators=8, max_depth=6, random_state=0),
    "boosted_binary": lambda: GradientBoostingClassifier(n_estimators=8, random_state=0),
    "boosted_3": lambda: GradientBoostingClassifier(n_estimators=8, random_state=0),
    "tree_3": lambda: DecisionTreeClassifier(random_state=0),
}


@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
def test_classifiers_match_sklearn_and_onnxruntime(name: str) -> None:
    model = CLASSIFIERS[name]()
    y = Y2 if name.endswith("binary") else Y3
    onx = _export(model, y)
    labels, scores = backend.prepare(onx).run([X])
    ref_labels, ref_scores = _onnxruntime(onx, {"X": X})
    np.testing.assert_array_equal(np.asarray(labels), ref_labels)
    np.testing.assert_allclose(np.asarray(scores), ref_scores, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(labels), model.predict(X))
    np.testing.assert_allclose(np.asarray(scores), model.predict_proba(X), rtol=1e-4, atol=1e-5)


REGRESSORS = {
    "forest": lambda: RandomForestRegressor(n_estimators=8, max_depth=8, random_state=0),
    "boosted": lambda: GradientBoostingRegressor(n_estimators=16, random_state=0),
    "tree": lambda: DecisionTreeRegressor(random_state=0),
}


@pytest.mark.parametrize("name", sorted(REGRESSORS))
def test_regressors_match_sklearn_and_onnxruntime(name: str) -> None:
    model = REGRESSORS[name]()
    onx = _export(model, YR)
    (ours,) = backend.prepare(onx).run([X])
    (theirs,) = _onnxruntime(onx, {"X": X})
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ours)[:, 0], model.predict(X), rtol=1e-4, atol=1e-4)


def test_as_tensor_forms_match_sklearn_in_float64() -> None:
    """A tree's float64 thresholds and values (the ``_as_tensor`` attributes) on float64 X.

    skl2onnx writes float32 attributes; here they are replaced by scikit-learn's
    own float64 tree (node i of the export is node i of ``tree_``), so that under
    64-bit JAX the predictions equal scikit-learn's to double precision.
    """
    model = DecisionTreeRegressor(random_state=0)
    onx = _export(model, YR)
    (node,) = onx.graph.node
    kept = [a for a in node.attribute if a.name not in ("nodes_values", "target_weights")]
    ids = {a.name: list(a.ints) for a in node.attribute if a.type == onnx.AttributeProto.INTS}
    thresholds = model.tree_.threshold[ids["nodes_nodeids"]]
    weights = model.tree_.value[ids["target_nodeids"], 0, 0]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.extend(
        [
            helper.make_attribute(
                "nodes_values_as_tensor",
                helper.make_tensor("v", TensorProto.DOUBLE, [thresholds.size], thresholds),
            ),
            helper.make_attribute(
                "target_weights_as_tensor",
                helper.make_tensor("w", TensorProto.DOUBLE, [weights.size], weights),
            ),
        ]
    )
    onx.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    for opset in onx.opset_import:
        opset.version = 3 if opset.domain == ML else opset.version
    x64 = X.astype(np.float64) + 1e-9  # off float32's grid: float32 thresholds would misplace some
    with jax.enable_x64(True):
        (ours,) = backend.prepare(onx).run([x64])
    np.testing.assert_allclose(np.asarray(ours)[:, 0], model.predict(x64), rtol=1e-6)


# ----------------------------------------------------------------------------- single nodes

# One tree of depth 2 on features 0 and 1 (node ids 0..4), then a one-leaf tree (id 1).
TREE = {
    "nodes_treeids": [0, 0, 0, 0, 0, 1],
    "nodes_nodeids": [0, 1, 2, 3, 4, 0],
    "nodes_featureids": [0, 1, 0, 0, 0, 0],
    "nodes_values": [0.25, -0.5, 0.0, 0.0, 0.0, 0.0],
    "nodes_truenodeids": [1, 3, 0, 0, 0, 0],
    "nodes_falsenodeids": [2, 4, 0, 0, 0, 0],
    "target_treeids": [0, 0, 0, 0, 1, 1],
    "target_nodeids": [2, 3, 4, 4, 0, 0],
    "target_ids": [0, 0, 0, 1, 0, 1],
    "target_weights": [1.5, -2.0, 4.0, 0.5, 0.25, 3.0],
}


def _regressor(mode: str = "BRANCH_LEQ", **attributes: Any) -> onnx.ModelProto:
    values = {**TREE, **attributes}
    values.setdefault("nodes_modes", [mode, mode, "LEAF", "LEAF", "LEAF", "LEAF"])
    node = helper.make_node(
        "TreeEnsembleRegressor", ["X"], ["Y"], domain=ML, name="forest", n_targets=2, **values
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 2])],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 3)]
    )


# Thresholds met exactly, NaNs, and values on either side.
FEATURES = np.array(
    [[0.25, -0.5], [0.3, 0.0], [-1.0, -0.6], [np.nan, 1.0], [0.0, np.nan], [0.25, -0.4]],
    np.float32,
)


@pytest.mark.parametrize(
    "mode", ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
)
@pytest.mark.parametrize("tracks", [None, [1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]])
def test_branch_modes_and_missing_values_as_onnxruntime(mode: str, tracks: Any) -> None:
    extra = {} if tracks is None else {"nodes_missing_value_tracks_true": tracks}
    model = _regressor(mode, **extra)
    (ours,) = backend.prepare(model).run([FEATURES])
    (theirs,) = _onnxruntime(model, {"X": FEATURES})
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-6)


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"])
def test_aggregates_transforms_and_base_values_as_onnxruntime(
    aggregate: str, transform: str
) -> None:
    model = _regressor(
        aggregate_function=aggregate, post_transform=transform, base_values=[0.125, -0.25]
    )
    x = FEATURES[np.isfinite(FEATURES).all(axis=1)]
    if transform == "PROBIT":  # probit takes probabilities
        model = _regressor(
            aggregate_function=aggregate,
            post_transform=transform,
            target_weights=[0.1, 0.2, 0.3, 0.6, 0.25, 0.15],
        )
    (ours,) = backend.prepare(model).run([x])
    (theirs,) = _onnxruntime(model, {"X": x})
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-5, atol=1e-6)


def test_float64_thresholds_decide_float32_features_exactly() -> None:
    """A double threshold between two float32 values splits them as onnxruntime does."""
    below = np.float32(0.1)  # 0.1 in float32 is above 0.1 in double
    threshold = float(below) - 1e-12
    model = _regressor(
        "BRANCH_LEQ",
        nodes_values=None,
        nodes_values_as_tensor=helper.make_tensor(
            "v", TensorProto.DOUBLE, [6], [threshold, -0.5, 0, 0, 0, 0]
        ),
    )
    x = np.array([[below, 0.0], [np.nextafter(below, np.float32(0)), 0.0]], np.float32)
    (ours,) = backend.prepare(model).run([x])
    # onnxruntime reads no double threshold beside float X. By hand: row 0 (0.1f, above the
    # threshold) goes false to leaf 2 (1.5, 0); row 1 (just below) goes true, then its 0.0 >
    # -0.5 false to leaf 4 (4, 0.5); the one-leaf tree adds (0.25, 3) to both. Rounding the
    # threshold to the nearest float32 (0.1f) would send row 0 true as well.
    np.testing.assert_allclose(np.asarray(ours), [[1.75, 3.0], [4.25, 3.5]], rtol=1e-6)


def _ensemble5(**attributes: Any) -> onnx.ModelProto:
    """TreeEnsemble (opset 5): root splits feature 0 (LEQ 0), its true child is a MEMBER node."""
    values: dict[str, Any] = {
        "tree_roots": [0, 2],
        "nodes_modes": helper.make_tensor("m", TensorProto.UINT8, [3], [0, 6, 3]),
        "nodes_featureids": [0, 1, 1],
        "nodes_splits": helper.make_tensor("s", TensorProto.FLOAT, [3], [0.0, 0.0, 0.5]),
        "nodes_truenodeids": [1, 0, 3],
        "nodes_trueleafs": [0, 1, 1],
        "nodes_falsenodeids": [2, 1, 4],
        "nodes_falseleafs": [1, 1, 1],
        "leaf_targetids": [0, 1, 2, 0, 1],
        "leaf_weights": helper.make_tensor("w", TensorProto.FLOAT, [5], [1, 2, 3, 4, -5]),
        "membership_values": helper.make_tensor(
            "mv", TensorProto.FLOAT, [4], [1.0, 3.0, 7.0, np.nan]
        ),
        "n_targets": 3,
    }
    values.update(attributes)
    node = helper.make_node("TreeEnsemble", ["X"], ["Y"], domain=ML, name="forest5", **values)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 3])],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(ML, 5)]
    )


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


OPSET5_X = np.array([[-1, 3], [-1, 2], [1, 0.25], [1, 0.75], [0, 7], [-2, np.nan]], np.float32)


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble_opset5_as_onnxruntime(aggregate: int) -> None:
    model = _ensemble5(aggregate_function=aggregate)
    (ours,) = backend.prepare(model).run([OPSET5_X])
    (theirs,) = _onnxruntime(model, {"X": OPSET5_X})
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("transform", [1, 2])
def test_tree_ensemble_opset5_post_transform_codes_follow_the_spec(transform: int) -> None:
    """SOFTMAX is 1 and LOGISTIC 2 in the ONNX schema (onnxruntime 1.32 reads them swapped)."""
    (scores,) = _onnxruntime(_ensemble5(), {"X": OPSET5_X})
    (ours,) = backend.prepare(_ensemble5(post_transform=transform)).run([OPSET5_X])
    expected = _softmax(scores) if transform == 1 else 1 / (1 + np.exp(-scores))
    np.testing.assert_allclose(np.asarray(ours), expected, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- refusals


def _refused(model: onnx.ModelProto, *words: str) -> str:
    with pytest.raises((ValueError, TypeError)) as caught:
        backend.prepare(model)
    message = str(caught.value)
    assert "forest" in message, message
    for word in words:
        assert word in message, message
    return message


def test_string_class_labels_refused_naming_the_node() -> None:
    node = helper.make_node(
        "TreeEnsembleClassifier",
        ["X"],
        ["L", "Z"],
        domain=ML,
        name="forest",
        classlabels_strings=["a", "b"],
        nodes_treeids=[0],
        nodes_nodeids=[0],
        nodes_modes=["LEAF"],
        nodes_featureids=[0],
        nodes_values=[0.0],
        nodes_truenodeids=[0],
        nodes_falsenodeids=[0],
        class_treeids=[0],
        class_nodeids=[0],
        class_ids=[0],
        class_weights=[1.0],
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
        [
            helper.make_tensor_value_info("L", TensorProto.STRING, [None]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, [None, 2]),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 3)]
    )
    with pytest.raises((ValueError, TypeError)) as caught:
        backend.prepare(model)
    assert "forest" in str(caught.value) and "string" in str(caught.value)


def test_unequal_lengths_refused() -> None:
    _refused(_regressor(nodes_featureids=[0, 1, 0]), "one length", "nodes_featureids 3")


def test_child_out_of_range_refused() -> None:
    _refused(_regressor(nodes_truenodeids=[1, 9, 0, 0, 0, 0]), "no node 9")


def test_target_on_no_leaf_refused() -> None:
    _refused(_regressor(target_nodeids=[2, 3, 4, 4, 0, 1]), "no leaf")


def test_target_id_out_of_range_refused() -> None:
    _refused(_regressor(target_ids=[0, 0, 0, 2, 0, 1]), "out of range")


def test_cycle_refused_without_hanging() -> None:
    _refused(_regressor(nodes_truenodeids=[1, 0, 0, 0, 0, 0]), "cycle")


def test_unknown_mode_refused() -> None:
    modes = ["BRANCH_LEQ", "BRANCH_SOMETIMES", "LEAF", "LEAF", "LEAF", "LEAF"]
    _refused(_regressor(nodes_modes=modes), "BRANCH_SOMETIMES")


def test_opset5_refusals() -> None:
    _refused(_ensemble5(tree_roots=[0, 5]), "tree_roots", "out of range")
    _refused(_ensemble5(nodes_truenodeids=[1, 7, 3]), "out of range")
    cyclic = {"nodes_truenodeids": [1, 0, 3], "nodes_trueleafs": [0, 0, 1]}
    _refused(_ensemble5(**cyclic), "cycle")
    _refused(_ensemble5(nodes_featureids=[0, 1]), "one length")
    no_sets = helper.make_tensor("mv", TensorProto.FLOAT, [2], [1.0, 3.0])
    _refused(_ensemble5(membership_values=no_sets), "MEMBER")


@pytest.mark.parametrize(
    ("name", "tensor"),
    [
        ("nodes_splits", helper.make_tensor("s", TensorProto.DOUBLE, [3], [0.0, 0.0, 0.5])),
        ("leaf_weights", helper.make_tensor("w", TensorProto.DOUBLE, [5], [1, 2, 3, 4, -5])),
        (
            "membership_values",
            helper.make_tensor("mv", TensorProto.FLOAT16, [4], [1.0, 3.0, 7.0, np.nan]),
        ),
    ],
)
def test_opset5_tensors_of_another_type_than_x_are_refused_as_in_onnxruntime(
    name: str, tensor: onnx.TensorProto
) -> None:
    """onnxruntime: "Attribute 'nodes_splits' must have same type as input"."""
    model = _ensemble5(**{name: tensor})
    with pytest.raises(Exception, match=r"must have same type as input"):  # its own types
        _onnxruntime(model, {"X": OPSET5_X})
    pattern = rf"node 'forest5' .*{name} is (float64|float16) but X is float32"
    with pytest.raises(TypeError, match=pattern):
        backend.prepare(model).run([OPSET5_X])


def _vector_x(model: onnx.ModelProto, declared: bool) -> onnx.ModelProto:
    """The model with a 1-D X (``declared``) or an X and Y of no declared shape, on which
    onnxruntime runs its kernel whatever the rank (a declared 1-D X it refuses at load)."""
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.ClearField("shape")
    if declared:
        model.graph.input[0].type.tensor_type.shape.dim.add().dim_value = 2
        model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 1
        model.graph.output[0].type.tensor_type.shape.dim.add().dim_param = "targets"
    return model


@pytest.mark.parametrize("build", [_regressor, _ensemble5], ids=["regressor", "opset5"])
def test_a_vector_x_is_one_feature_as_in_onnxruntime(build: Any) -> None:
    """onnxruntime's kernel reads a 1-D X as one sample of one feature: a node reading
    feature 1 is refused ("requests feature 1 but input tensor has 1 features")."""
    x = np.array([0.1, 0.3], np.float32)
    with pytest.raises(Exception, match=r"requests feature 1"):  # onnxruntime's own types
        _onnxruntime(_vector_x(build(), declared=False), {"X": x})
    with pytest.raises(ValueError, match=r"node 'forest5?' .*reads feature 1 but X is 1-D"):
        backend.prepare(_vector_x(build(), declared=True)).run([x])
    first = {"nodes_featureids": [0] * (6 if build is _regressor else 3)}
    (ours,) = backend.prepare(_vector_x(build(**first), declared=True)).run([x])
    (theirs,) = _onnxruntime(_vector_x(build(**first), declared=False), {"X": x})
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-6)


# ----------------------------------------------------------------------------- encoders


def _one_node(
    op: str, x: np.ndarray, out: int, ml_opset: int = 2, **attributes: Any
) -> onnx.ModelProto:
    node = helper.make_node(op, ["X"], ["Y"], domain=ML, name="encoder", **attributes)
    x_type = helper.np_dtype_to_tensor_dtype(x.dtype)
    shape = [*x.shape, 4] if op == "OneHotEncoder" else list(x.shape)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", x_type, list(x.shape))],
        [helper.make_tensor_value_info("Y", out, shape)],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, ml_opset)]
    )


def _as_onnxruntime(model: onnx.ModelProto, x: np.ndarray) -> None:
    (ours,) = backend.prepare(model).run([x])
    (theirs,) = _onnxruntime(model, {"X": x})
    assert np.asarray(ours).dtype == theirs.dtype, (np.asarray(ours).dtype, theirs.dtype)
    np.testing.assert_array_equal(np.asarray(ours), theirs)


LABEL_X_FLOAT = np.array([[1.5, -2.0, 7.0], [np.nan, 0.0, 1.5]], np.float32)
LABEL_X_INT = np.array([3, -1, 10, 3, 0], np.int64)


def test_label_encoder_float_keys_to_int64s() -> None:
    model = _one_node(
        "LabelEncoder",
        LABEL_X_FLOAT,
        TensorProto.INT64,
        keys_floats=[7.0, 1.5, -2.0],
        values_int64s=[70, 15, -20],
        default_int64=99,
    )
    _as_onnxruntime(model, LABEL_X_FLOAT)


def test_label_encoder_int_keys_to_floats_default() -> None:
    model = _one_node(
        "LabelEncoder",
        LABEL_X_INT,
        TensorProto.FLOAT,
        keys_int64s=[10, 3, 0],
        values_floats=[1.0, 0.5, -3.0],
    )
    _as_onnxruntime(model, LABEL_X_INT)


def test_label_encoder_opset4_tensors_and_nan_key() -> None:
    """By hand (onnxruntime has no float -> int16 kernel): a NaN key matches NaN."""
    model = _one_node(
        "LabelEncoder",
        LABEL_X_FLOAT,
        TensorProto.INT16,
        ml_opset=4,
        keys_tensor=helper.make_tensor("k", TensorProto.FLOAT, [3], [np.nan, 7.0, 1.5]),
        values_tensor=helper.make_tensor("v", TensorProto.INT16, [3], [5, 6, 7]),
        default_tensor=helper.make_tensor("d", TensorProto.INT16, [1], [-4]),
    )
    (ours,) = backend.prepare(model).run([LABEL_X_FLOAT])
    assert np.asarray(ours).dtype == np.int16
    np.testing.assert_array_equal(np.asarray(ours), [[7, -4, 6], [5, -4, 7]])


def test_label_encoder_refusals() -> None:
    strings = _one_node(
        "LabelEncoder", LABEL_X_INT, TensorProto.INT64, keys_strings=["a"], values_int64s=[1]
    )
    with pytest.raises((ValueError, TypeError), match=r"encoder.*string"):
        backend.prepare(strings)
    unequal = _one_node(
        "LabelEncoder", LABEL_X_INT, TensorProto.FLOAT, keys_int64s=[1, 2], values_floats=[1.0]
    )
    with pytest.raises(ValueError, match=r"encoder.*one length"):
        backend.prepare(unequal)


@pytest.mark.parametrize(
    ("x", "keys"),
    [(LABEL_X_INT, {"keys_int64s": [3, 0, 3]}), (LABEL_X_FLOAT, {"keys_floats": [1.5, 7.0, 1.5]})],
    ids=["int64", "float"],
)
def test_label_encoder_repeated_key_maps_to_its_first_value_as_onnxruntime(
    x: np.ndarray, keys: dict[str, list[Any]]
) -> None:
    """onnxruntime keeps a repeated key's first value (its map keeps the first insert)."""
    repeated = _one_node(
        "LabelEncoder", x, TensorProto.FLOAT, values_floats=[1.0, 2.0, 3.0], **keys
    )
    _as_onnxruntime(repeated, x)


@pytest.mark.parametrize("per_feature", [False, True])
def test_imputer_floats_and_nan_as_onnxruntime(per_feature: bool) -> None:
    x = np.array([[np.nan, 1.0, 2.0], [3.0, np.nan, -1.0]], np.float32)
    imputed = [9.0, 8.0, 7.0] if per_feature else [5.5]
    model = _one_node(
        "Imputer",
        x,
        TensorProto.FLOAT,
        imputed_value_floats=imputed,
        replaced_value_float=float("nan"),
    )
    _as_onnxruntime(model, x)


def test_imputer_int64_as_onnxruntime() -> None:
    x = np.array([[0, 4, -1], [-1, -1, 2]], np.int64)
    model = _one_node(
        "Imputer",
        x,
        TensorProto.INT64,
        imputed_value_int64s=[10, 20, 30],
        replaced_value_int64=-1,
    )
    _as_onnxruntime(model, x)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float32, np.float64])
def test_one_hot_encoder_by_hand_and_as_onnxruntime(dtype: Any) -> None:
    x = np.array([[1, 5, 2], [2, 9, 1]], dtype)
    cats = [2, 1, 5, 7]
    model = _one_node("OneHotEncoder", x, TensorProto.FLOAT, cats_int64s=cats)
    with jax.enable_x64(True):
        (ours,) = backend.prepare(model).run([x])
    expected = (x[..., None] == np.array(cats)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(ours), expected)
    if dtype != np.int32:  # onnxruntime has no int32 kernel
        (theirs,) = _onnxruntime(model, {"X": x})
        np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_one_hot_encoder_zeros_0_raises_after_the_run() -> None:
    x = np.array([1, 4], np.int64)
    model = _one_node("OneHotEncoder", x, TensorProto.FLOAT, cats_int64s=[1, 2], zeros=0)
    with pytest.raises(ValueError, match=r"encoder.*4.*no category"):
        backend.prepare(model).run([x])
    strings = _one_node("OneHotEncoder", x, TensorProto.FLOAT, cats_strings=["a"])
    with pytest.raises(ValueError, match=r"encoder.*strings"):
        backend.prepare(strings)


# ----------------------------------------------------------------------------- TfIdfVectorizer

# 1-grams 2, 3, 5, 4; 2-grams (5, 6), (7, 8), (6, 7); 3-gram (2, 3, 5)
TFIDF_POOL = {
    "pool_int64s": [2, 3, 5, 4, 5, 6, 7, 8, 6, 7, 2, 3, 5],
    "ngram_counts": [0, 4, 10],
    "ngram_indexes": [0, 1, 2, 3, 4, 5, 6, 7],
}
TOKENS = np.array([[2, 3, 5, 6, 7, 8, 6, 7], [1, 5, 6, 6, 5, 2, 3, 5]], np.int64)


def _tfidf(x: np.ndarray, **attributes: Any) -> onnx.ModelProto:
    values = {**TFIDF_POOL, "min_gram_length": 1, "max_gram_length": 3, "max_skip_count": 0}
    values.update(attributes)
    node = helper.make_node("TfIdfVectorizer", ["X"], ["Y"], name="tfidf", **values)
    out = [x.shape[0], 8] if x.ndim == 2 else [8]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, out)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("skip", [0, 1, 3])
@pytest.mark.parametrize("lengths", [(1, 3), (2, 3), (1, 1)])
def test_tfidf_vectorizer_as_onnxruntime(mode: str, skip: int, lengths: tuple[int, int]) -> None:
    weights = {"weights": [0.5, 1.0, 2.0, 3.0, 0.25, 4.0, 1.5, 0.75]} if mode != "TF" else {}
    model = _tfidf(
        TOKENS,
        mode=mode,
        max_skip_count=skip,
        min_gram_length=lengths[0],
        max_gram_length=lengths[1],
        **weights,
    )
    (ours,) = backend.prepare(model).run([TOKENS])
    (theirs,) = _onnxruntime(model, {"X": TOKENS})
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-6)


def test_tfidf_vectorizer_int32_vector_as_onnxruntime() -> None:
    x = TOKENS[1].astype(np.int32)
    model = _tfidf(x, mode="TF", max_skip_count=2)
    (ours,) = backend.prepare(model).run([x])
    (theirs,) = _onnxruntime(model, {"X": x})
    np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_tfidf_vectorizer_refusals() -> None:
    strings = {"pool_strings": ["a", "b"], "pool_int64s": None, "ngram_counts": [0]}
    with pytest.raises(ValueError, match=r"tfidf.*strings"):
        backend.prepare(_tfidf(TOKENS, mode="TF", ngram_indexes=[0, 1], **strings))
    with pytest.raises(ValueError, match=r"tfidf.*ngram_indexes"):
        backend.prepare(_tfidf(TOKENS, mode="TF", ngram_indexes=[0, 1]))
    with pytest.raises(ValueError, match=r"tfidf.*2-grams"):
        backend.prepare(_tfidf(TOKENS, mode="TF", ngram_counts=[0, 3, 10]))


TFIDF_REFUSED = {
    # onnxruntime: "max_gram_length must be inbounds of ngram_counts: 4 <= 3"
    "max_gram_length_past_ngram_counts": ({"max_gram_length": 4}, r"max_gram_length 4 .*3"),
    "min_gram_length_past_ngram_counts": (
        {"min_gram_length": 4, "max_gram_length": 4},
        r"min_gram_length 4 .*3",
    ),
    # "Got weights of size: 9 but ngram_indexes size: 8 must be of equal size"
    "weights_more_than_ngram_indexes": ({"weights": [1.0] * 9}, r"9 weights for 8 ngram_indexes"),
    # "Duplicate ngram detected, size: 1"
    "duplicate_1_gram": (
        {"pool_int64s": [2, 3, 2, 4, 5, 6, 7, 8, 6, 7, 2, 3, 5]},
        r"1-gram \[2\] twice",
    ),
    "duplicate_2_gram": (
        {"pool_int64s": [2, 3, 5, 4, 5, 6, 7, 8, 5, 6, 2, 3, 5]},
        r"2-gram \[5, 6\] twice",
    ),
}


@pytest.mark.parametrize("case", sorted(TFIDF_REFUSED))
def test_tfidf_vectorizer_refuses_what_onnxruntime_refuses(case: str) -> None:
    attributes, pattern = TFIDF_REFUSED[case]
    model = _tfidf(TOKENS, mode="TF", **attributes)
    with pytest.raises(Exception, match=r"ngram|weights|Duplicate"):  # onnxruntime's own types
        _onnxruntime(model, {"X": TOKENS})
    with pytest.raises(ValueError, match=rf"node 'tfidf' .*{pattern}"):
        backend.prepare(model)


def test_tfidf_vectorizer_of_no_rows_is_refused() -> None:
    """onnxruntime: "Input shape must have either [C] or [B,C] dimensions with B > 0"."""
    x = np.zeros((0, 8), np.int64)
    model = _tfidf(x, mode="TF")
    with pytest.raises(Exception, match="B > 0"):  # onnxruntime's own types
        _onnxruntime(model, {"X": x})
    with pytest.raises(ValueError, match=r"node 'tfidf' .*input X has shape \[0, 8\]"):
        backend.prepare(model).run([x])


def test_tfidf_vectorizer_with_more_ngram_indexes_than_ngrams_as_onnxruntime() -> None:
    """Columns past the pool's n-grams stay 0 (onnxruntime accepts them)."""
    model = _tfidf(TOKENS, mode="TF", ngram_indexes=[*range(8), 9])
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 10
    (ours,) = backend.prepare(model).run([TOKENS])
    (theirs,) = _onnxruntime(model, {"X": TOKENS})
    np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_huge_target_count_refused_before_allocating() -> None:
    with pytest.raises(ValueError, match=r"forest5"):
        backend.prepare(_ensemble5(n_targets=2**40))


def test_one_hot_encoder_output_past_the_limit_refused() -> None:
    x = np.zeros((2**16, 2**4), np.int64)
    model = _one_node("OneHotEncoder", x, TensorProto.FLOAT, cats_int64s=list(range(4)))
    model.graph.output[0].type.tensor_type.shape.dim[-1].dim_value = 4
    with pytest.raises(ValueError, match=r"encoder"):
        backend.prepare(model, limits=backend.Limits(tensor_bytes=2**20)).run([x])


def test_missing_thresholds_and_empty_forests_refused() -> None:
    _refused(_regressor(nodes_values=None), "nodes_values")
    no_trees = _ensemble5()
    (roots,) = [a for a in no_trees.graph.node[0].attribute if a.name == "tree_roots"]
    del roots.ints[:]
    _refused(no_trees, "tree_roots")
    two_defaults = _one_node(
        "LabelEncoder",
        LABEL_X_FLOAT,
        TensorProto.INT16,
        ml_opset=4,
        keys_tensor=helper.make_tensor("k", TensorProto.FLOAT, [1], [1.5]),
        values_tensor=helper.make_tensor("v", TensorProto.INT16, [1], [5]),
        default_tensor=helper.make_tensor("d", TensorProto.INT16, [2], [1, 2]),
    )
    with pytest.raises(ValueError, match=r"encoder.*default_tensor"):
        backend.prepare(two_defaults)


def test_a_long_cycle_is_refused_quickly() -> None:
    """100,000 nodes in one ring: found in linear time, not walked forever."""
    n = 100_000
    ring = {
        "nodes_treeids": [0] * (n + 1),
        "nodes_nodeids": list(range(n + 1)),
        "nodes_featureids": [0] * (n + 1),
        "nodes_values": [0.0] * (n + 1),
        "nodes_truenodeids": [(i + 1) % n for i in range(n)] + [0],
        "nodes_falsenodeids": [n] * (n + 1),
        "nodes_modes": ["BRANCH_LEQ"] * n + ["LEAF"],
        "target_treeids": [0],
        "target_nodeids": [n],
        "target_ids": [0],
        "target_weights": [1.0],
    }
    started = time.perf_counter()
    _refused(_regressor(**ring), "cycle")
    assert time.perf_counter() - started < 30


def _binary(class_id: int, weights: list[float], transform: str, base: Any) -> onnx.ModelProto:
    """A one-score binary classifier: one split, two leaves writing one class id."""
    attributes: dict[str, Any] = {
        "nodes_treeids": [0, 0, 0],
        "nodes_nodeids": [0, 1, 2],
        "nodes_featureids": [0, 0, 0],
        "nodes_values": [0.0, 0.0, 0.0],
        "nodes_modes": ["BRANCH_LEQ", "LEAF", "LEAF"],
        "nodes_truenodeids": [1, 0, 0],
        "nodes_falsenodeids": [2, 0, 0],
        "class_treeids": [0, 0],
        "class_nodeids": [1, 2],
        "class_ids": [class_id, class_id],
        "class_weights": weights,
        "classlabels_int64s": [3, 8],
        "post_transform": transform,
        "base_values": base,
    }
    node = helper.make_node(
        "TreeEnsembleClassifier", ["X"], ["L", "Z"], domain=ML, name="forest", **attributes
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 1])],
        [
            helper.make_tensor_value_info("L", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, [None, 2]),
        ],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 3)]
    )


@pytest.mark.parametrize("weights", [[0.3, 0.8], [-0.4, 0.7], [0.2, 0.4]])
@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("base", [None, [0.1], [-1.0]])
def test_one_score_binary_classifier_as_onnxruntime(
    weights: list[float], transform: str, base: Any
) -> None:
    model = _binary(0, weights, transform, base)
    x = np.array([[-1.0], [1.0]], np.float32)
    labels, scores = backend.prepare(model).run([x])
    ref_labels, ref_scores = _onnxruntime(model, {"X": x})
    np.testing.assert_array_equal(np.asarray(labels), ref_labels)
    np.testing.assert_allclose(np.asarray(scores), ref_scores, rtol=1e-6, atol=1e-7)


def test_one_score_binary_forms_onnxruntime_leaves_undefined_are_refused() -> None:
    _refused(_binary(1, [0.3, 0.8], "NONE", None), "class id 0")
    _refused(_binary(0, [0.3, 0.8], "NONE", [0.1, 0.2]), "one base value")
    _refused(_binary(0, [0.3, 0.8], "PROBIT", None), "PROBIT")


def _classes(k: int, transform: str, base: Any) -> onnx.ModelProto:
    """One split, two leaves, each writing a weight for every one of ``k`` classes."""
    attributes: dict[str, Any] = {
        "nodes_treeids": [0, 0, 0],
        "nodes_nodeids": [0, 1, 2],
        "nodes_featureids": [0, 0, 0],
        "nodes_values": [0.0, 0.0, 0.0],
        "nodes_modes": ["BRANCH_LEQ", "LEAF", "LEAF"],
        "nodes_truenodeids": [1, 0, 0],
        "nodes_falsenodeids": [2, 0, 0],
        "class_treeids": [0] * (2 * k),
        "class_nodeids": [1] * k + [2] * k,
        "class_ids": list(range(k)) * 2,
        "class_weights": list(np.linspace(-0.5, 0.9, 2 * k).round(3)),
        "classlabels_int64s": list(range(10, 10 + k)),
        "post_transform": transform,
        "base_values": base,
    }
    node = helper.make_node(
        "TreeEnsembleClassifier", ["X"], ["L", "Z"], domain=ML, name="forest", **attributes
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 1])],
        [
            helper.make_tensor_value_info("L", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, [None, k]),
        ],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 3)]
    )


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"])
@pytest.mark.parametrize("base", [None, [0.1, 0.1, 0.1], [-0.2, 0.1, 0.4]])
def test_three_classes_with_base_values_as_onnxruntime(transform: str, base: Any) -> None:
    model = _classes(3, transform, base)
    x = np.array([[-1.0], [1.0]], np.float32)
    labels, scores = backend.prepare(model).run([x])
    ref_labels, ref_scores = _onnxruntime(model, {"X": x})
    np.testing.assert_array_equal(np.asarray(labels), ref_labels)
    np.testing.assert_allclose(np.asarray(scores), ref_scores, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("base", [None, [-0.2, 0.1]])
def test_two_classes_both_written_as_onnx_reference(transform: str, base: Any) -> None:
    """onnxruntime labels this form by ``score[1] > 0`` as a raw 0/1; onnx's reference by argmax."""
    model = _classes(2, transform, base)
    x = np.array([[-1.0], [1.0]], np.float32)
    labels, scores = backend.prepare(model).run([x])
    ref_labels, ref_scores = ReferenceEvaluator(model).run(None, {"X": x})
    np.testing.assert_array_equal(np.asarray(labels), ref_labels)
    np.testing.assert_allclose(np.asarray(scores), ref_scores, rtol=1e-5, atol=1e-6)
