"""A differential oracle for the fuzzer: onnxruntime refuses, so must we (issue 33).

For a mutated *inference* model (no ``ai.onnx.preview.training`` op, no
``training_info``) and drawn feeds, ``backend.prepare(model).run(feeds)`` and
``onnxruntime.InferenceSession(bytes).run(feeds)`` run side by side:

* where onnxruntime refuses the model or its feeds (at session creation or at
  run) we must refuse too, with a documented exception (:data:`DOCUMENTED`),
  unless onnxruntime's refusal is one of :data:`ORT_LACKS` (a kernel or a
  feature onnxruntime lacks, not something wrong with the model);
* where both give a result, ``--compare`` (optional: ``FUZZ_COMPARE=1`` in the
  CI test) also asks for the same output shapes and dtypes, values close for
  floats, exact for ints and bools.

The seeds (:func:`seeds`) are small models whose index, ROI and scale operands
are graph inputs, so the drawn feeds (:func:`draw_feeds`) reach data-dependent
checks: indices out of range, NaN and inf in rois and scales. The mutations
(:data:`MUTATIONS`) add the rest of the class: constants made feeds,
attributes that must agree with other attributes or with a subgraph's
signature, packed sub-byte tensors whose storage disagrees with their dims,
opsets beyond what onnx defines. By hand (in a child, as ``test_fuzz.py`` does)::

    python -m tests.support.fuzz_models --differential --examples 2000 --seed 3 --findings f.txt
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_optax import backend
from tests.support import fuzz_mutations as mutations

DOCUMENTED = (TypeError, ValueError, NotImplementedError)
TRAINING = "ai.onnx.preview.training"

# onnxruntime's refusals that say nothing about the model: it lacks a kernel or a feature
# that onnx defines. Each pattern is matched against onnxruntime's message.
ORT_LACKS = [
    # status NOT_IMPLEMENTED: onnxruntime has no kernel for this op, type or attribute value
    # (say Resize's antialias with some modes, a cast to float4, an op of ai.onnx.preview.training)
    r": 9 : NOT_IMPLEMENTED :",
    # no kernel registered for the op at this opset and input types (an op onnx defines for
    # uint16, say, where onnxruntime's CPU provider registers only float and int64)
    r"Could not find an implementation for",
    # a domain onnxruntime does not know at all: a custom domain of the model's own
    r"No opset import for domain|is not a registered function/op|No Op registered for",
    # onnxruntime's own limits on opsets or IR versions that onnx (installed) still defines:
    # only where the version is within onnx's; beyond it, both must refuse (see _beyond_onnx)
    r"is under development and support for this is limited|"
    r"Unsupported model IR version|is till opset|is not supported yet",
    # types onnxruntime's CPU provider cannot hold, though onnx defines them
    r"not supported for (type|data type)|type is not supported|Unsupported data type",
    # a resource limit, not a refusal: onnxruntime materializes a tensor (a ConstantOfShape of
    # 2**31 elements under the fuzzer's memory limit) that XLA folds away, say into a ReduceSum
    r"Failed to allocate memory|bad_alloc",
    # what the ONNX specification defines and onnxruntime's CPU kernel does not (the choices
    # in docs/security.md): an LRN of even size
    r"size_ % 2 == 1 was false",
]


def _lacks(message: str, model: onnx.ModelProto | None) -> bool:
    """Whether onnxruntime's ``message`` says it lacks a feature, not that the model is wrong."""
    if model is not None and _beyond_onnx(model):
        return False  # an opset or IR version past onnx's: ours must refuse it as well
    if re.search(r"data type:? 0\b", message):
        return False  # "Unsupported data type: 0" is UNDEFINED, no type onnx defines
    return any(re.search(pattern, message) for pattern in ORT_LACKS)


@functools.cache
def _newest() -> dict[str, int]:
    """The newest opset of each domain installed onnx defines ('' for ai.onnx)."""
    found: dict[str, int] = {"": onnx.defs.onnx_opset_version()}
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain:
            found[schema.domain] = max(found.get(schema.domain, 0), schema.since_version)
    return found


def _beyond_onnx(model: onnx.ModelProto) -> bool:
    """Whether the model's IR version or an opset of a domain onnx knows is past onnx's."""
    if model.ir_version > onnx.IR_VERSION:
        return True
    newest = _newest()
    for opset in model.opset_import:
        domain = "" if opset.domain == "ai.onnx" else opset.domain
        if domain in newest and opset.version > newest[domain]:
            return True
    return False


def _graph(
    name: str,
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, list[Any]]],
    outputs: list[tuple[str, int, list[Any]]],
    constants: dict[str, np.ndarray] | None = None,
    opsets: dict[str, int] | None = None,
) -> bytes:
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(*value) for value in inputs],
        [helper.make_tensor_value_info(*value) for value in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in (constants or {}).items()],
    )
    imports = [helper.make_opsetid(d, v) for d, v in ({"": 21} | (opsets or {})).items()]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10
    return model.SerializeToString()


F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def seeds() -> dict[str, bytes]:
    """Inference models whose data-dependent operands (indices, rois, scales) are graph inputs."""
    from tests.support import fuzz_models

    found = {name: fuzz_models.seeds()[name] for name in ("mlp", "cnn", "shapes", "indexing")}
    node = helper.make_node
    found |= {
        "gather": _graph(
            "gather", [node("Gather", ["x", "i"], ["y"], axis=0)],
            [("x", F, [5, 3]), ("i", I64, [2])], [("y", F, [2, 3])],
        ),
        "gather_elements": _graph(
            "gather_elements", [node("GatherElements", ["x", "i"], ["y"], axis=1)],
            [("x", F, [2, 3]), ("i", I64, [2, 2])], [("y", F, [2, 2])],
        ),
        "gathernd": _graph(
            "gathernd", [node("GatherND", ["x", "i"], ["y"])],
            [("x", F, [2, 3]), ("i", I64, [2, 2])], [("y", F, [2])],
        ),
        "scatternd": _graph(
            "scatternd", [node("ScatterND", ["x", "i", "u"], ["y"])],
            [("x", F, [4]), ("i", I64, [2, 1]), ("u", F, [2])], [("y", F, [4])],
        ),
        "scatter_elements": _graph(
            "scatter_elements", [node("ScatterElements", ["x", "i", "u"], ["y"], axis=0)],
            [("x", F, [4, 2]), ("i", I64, [1, 2]), ("u", F, [1, 2])], [("y", F, [4, 2])],
        ),
        "onehot": _graph(
            "onehot", [node("OneHot", ["i", "depth", "values"], ["y"], axis=-1)],
            [("i", I64, [3])], [("y", F, [3, 4])],
            {"depth": np.array(4, np.int64), "values": np.array([0.0, 1.0], np.float32)},
        ),
        "array_feature": _graph(
            "array_feature", [node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain="ai.onnx.ml")],
            [("x", F, [2, 4]), ("i", I64, [2])], [("y", F, [2, 2])], opsets={"ai.onnx.ml": 3},
        ),
        "compress": _graph(
            "compress", [node("Compress", ["x", "c"], ["y"], axis=0)],
            [("x", F, [4, 2]), ("c", B, [3])], [("y", F, ["n", 2])],
        ),
        "roialign": _graph(
            "roialign",
            [node("RoiAlign", ["x", "rois", "b"], ["y"], output_height=2, output_width=2)],
            [("x", F, [2, 1, 4, 4]), ("rois", F, [2, 4]), ("b", I64, [2])],
            [("y", F, [2, 1, 2, 2])],
        ),
        "resize": _graph(
            "resize", [node("Resize", ["x", "", "scales"], ["y"], mode="nearest")],
            [("x", F, [1, 1, 2, 2]), ("scales", F, [4])], [("y", F, ["n", "c", "h", "w"])],
        ),
        "slice_tile": _graph(
            "slice_tile",
            [node("Slice", ["x", "s", "e"], ["a"]), node("Tile", ["a", "r"], ["y"])],
            [("x", F, [4]), ("s", I64, [1]), ("e", I64, [1]), ("r", I64, [1])], [("y", F, ["n"])],
        ),
        "topk_split": _graph(
            "topk_split",
            [node("TopK", ["x", "k"], ["v", "j"]), node("Split", ["x", "sp"], ["p", "q"])],
            [("x", F, [4]), ("k", I64, [1]), ("sp", I64, [2])],
            [("v", F, ["k"]), ("j", I64, ["k"]), ("p", F, ["a"]), ("q", F, ["b"])],
        ),
        "reshape_expand": _graph(
            "reshape_expand",
            [node("Reshape", ["x", "s"], ["a"]), node("Expand", ["a", "e"], ["y"])],
            [("x", F, [2, 3]), ("s", I64, [2]), ("e", I64, [2])], [("y", F, ["a", "b"])],
        ),
        "int4": _graph(
            "int4",
            [node("DequantizeLinear", ["q", "scale"], ["y"])],
            [], [("y", F, [4])],
            {"scale": np.array(0.5, np.float32)},
        ),
    }  # fmt: skip
    int4 = onnx.ModelProto.FromString(found["int4"])
    int4.graph.initializer.append(helper.make_tensor("q", TensorProto.INT4, [4], [1, -2, 3, 7]))
    found["int4"] = int4.SerializeToString()
    return found


INDICES = [0, 1, 2, 3, -1, -2, -3, -4, 4, 5, 6, -5, -6, -7, 2**31, -(2**31) - 1, 2**62, -(2**63)]
FLOATS = [0.0, 1.0, 2.0, -1.0, 0.5, 1.5, 3.0, 1e30, -1e30, math.nan, math.inf, -math.inf]


ODD = st.sampled_from([False] * 15 + [True])  # a feed of another shape or type, one in 16


def draw_feeds(
    model: onnx.ModelProto, data: st.DataObject, mistype: bool = True
) -> dict[str, np.ndarray]:
    """Feeds for the graph's inputs: declared shape (mostly), values drawn to hit range checks."""
    stored = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if value.name in stored:
            continue
        kind = value.type.tensor_type
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(kind.elem_type))
        except Exception:  # a type numpy lacks (or none): float will do
            dtype = np.dtype(np.float32)
        if dtype.kind not in "biuf" or dtype.itemsize > 8:
            dtype = np.dtype(np.float32)
        dims = [d.dim_value if d.HasField("dim_value") else 2 for d in kind.shape.dim]
        shape = [d if 0 <= d <= 6 else 2 for d in dims]
        if mistype and data.draw(ODD, label=f"feed {value.name} odd"):
            how = data.draw(st.sampled_from(["shape", "rank", "dtype"]), label="odd feed")
            if how == "shape":
                shape = [d + 1 for d in shape]
            elif how == "rank":
                shape = [*shape, 1]
            else:
                dtype = np.dtype(np.int32 if dtype.kind == "f" else np.float32)
        size = math.prod(shape)
        if dtype.kind == "b":
            flat = data.draw(st.lists(st.booleans(), min_size=size, max_size=size), label="feed")
            feeds[value.name] = np.array(flat, np.bool_).reshape(shape)
            continue
        pool = INDICES if dtype.kind in "iu" else FLOATS
        fill = data.draw(st.sampled_from(["same", "each"]), label=f"feed {value.name}")
        if fill == "same":
            flat = [data.draw(st.sampled_from(pool), label="value")] * size
        else:
            flat = data.draw(st.lists(st.sampled_from(pool), min_size=size, max_size=size))
        with np.errstate(all="ignore"):
            if dtype.kind in "iu":
                info = np.iinfo(dtype)
                flat = [min(max(int(v), info.min), info.max) for v in flat]
            feeds[value.name] = np.array(flat, dtype).reshape(shape)
    return feeds


def _float_outputs(model: onnx.ModelProto) -> None:
    """Outputs without a type made float of unknown shape, with no onnx shape inference.

    Not fuzz_mutations._typed: onnx's shape inference aborts the process (an assertion in
    C++, std::vector::operator[]) on some of the nodes made here, a Conv or pool whose
    attributes disagree, say; onnx_optax does not call it.
    """
    for value in model.graph.output:
        if not value.HasField("type"):
            value.type.tensor_type.elem_type = F
            value.type.tensor_type.shape.dim.add().dim_param = "unknown"


def constant_to_feed(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """An initializer of the main graph made a graph input, so that the feeds pick its values."""
    tensors = [t for t in model.graph.initializer if t.data_type in (TensorProto.INT64, F)]
    tensor = mutations._pick(data, tensors, "tensor")
    if tensor is None:
        return "no initializer"
    model.graph.input.append(
        helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
    )
    model.graph.initializer.remove(tensor)
    return f"initializer {tensor.name!r} made a graph input"


def future_opset(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """The default (or ml) opset or the IR version past what onnx defines, or at its newest."""
    newest = onnx.defs.onnx_opset_version()
    what = data.draw(st.sampled_from(["opset", "ml opset", "ir"]), label="what")
    delta = data.draw(st.sampled_from([-1, 0, 1, 2, 100]), label="delta")
    if what == "ir":
        model.ir_version = onnx.IR_VERSION + delta
        return f"ir_version = {model.ir_version}"
    domain, top = ("", newest) if what == "opset" else ("ai.onnx.ml", 5)
    for opset in model.opset_import:
        if (opset.domain or "") == domain:
            opset.version = top + delta
            return f"opset {domain!r} = {opset.version}"
    model.opset_import.append(helper.make_opsetid(domain, top + delta))
    return f"opset {domain!r} = {top + delta} (added)"


PACKED = [TensorProto.INT4, TensorProto.UINT4, TensorProto.FLOAT4E2M1, TensorProto.INT2,
          TensorProto.UINT2] if hasattr(TensorProto, "INT2") else [
          TensorProto.INT4, TensorProto.UINT4, TensorProto.FLOAT4E2M1]  # fmt: skip


def packed_tensor(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A sub-byte tensor (new, cast to float) whose storage disagrees with its dims."""
    elem = data.draw(st.sampled_from(PACKED), label="type")
    count = data.draw(st.integers(0, 9), label="dims")
    tensor = TensorProto(name="packed", data_type=elem, dims=[count])
    where = data.draw(st.sampled_from(["raw", "int32_data", "both"]), label="storage")
    size = data.draw(st.integers(0, 8), label="stored")
    if where in ("raw", "both"):
        tensor.raw_data = bytes(range(1, size + 1))
    if where in ("int32_data", "both"):
        tensor.int32_data.extend(range(size))
    graph = model.graph
    graph.initializer.append(tensor)
    graph.node.append(helper.make_node("Cast", ["packed"], ["packed.f"], to=F))
    mutations._output(graph, "packed.f")
    _float_outputs(model)
    return f"packed {elem} dims [{count}], {size} stored in {where}"


def subgraph_signature(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """An If, Loop or Scan whose body disagrees with the node: count of inputs or outputs."""
    graph = model.graph
    source = mutations._pick(data, [v.name for v in graph.input], "source")
    if source is None:
        return "no input"
    kind = data.draw(st.sampled_from(["If", "Loop", "Scan"]), label="kind")
    extra_in = data.draw(st.integers(-1, 1), label="body inputs off by")
    extra_out = data.draw(st.integers(-1, 1), label="body outputs off by")
    node = helper.make_node
    if kind == "If":
        then = mutations._subgraph("then", [node("Identity", [source], ["t"])], [], ["t"])
        other_outputs = ["e", "e2"][: max(0, 1 + extra_out)]
        nodes = [node("Identity", [source], [o]) for o in other_outputs]
        other = mutations._subgraph("else", nodes, [], other_outputs)
        graph.initializer.append(numpy_helper.from_array(np.array(True), "sig.cond"))
        made = node("If", ["sig.cond"], ["sig.out"], then_branch=then, else_branch=other)
    elif kind == "Loop":
        inputs = ["sig.i", "sig.c", "sig.v", "sig.w"][: 3 + extra_in]
        outputs = ["sig.c2", "sig.v2", "sig.w2"][: 2 + extra_out]
        nodes = [node("Identity", [inputs[min(k + 1, len(inputs) - 1)]], [o])
                 for k, o in enumerate(outputs)]  # fmt: skip
        body = mutations._subgraph("loop", nodes, inputs, outputs)
        graph.initializer.append(numpy_helper.from_array(np.array(2, np.int64), "sig.M"))
        made = node("Loop", ["sig.M", "", source], ["sig.out"], body=body)
    else:
        inputs = ["sig.a", "sig.b"][: 1 + extra_in] or []
        outputs = ["sig.o", "sig.p"][: 1 + extra_out]
        nodes = [node("Identity", [inputs[0] if inputs else source], [o]) for o in outputs]
        body = mutations._subgraph("scan", nodes, inputs, outputs)
        made = node("Scan", [source], ["sig.out"], body=body, num_scan_inputs=1)
    graph.node.append(made)
    mutations._output(graph, "sig.out")
    _float_outputs(model)
    return f"{kind} of {source!r}: body inputs {extra_in:+}, outputs {extra_out:+}"


def _ints(name: str, values: list[int]) -> onnx.AttributeProto:
    return helper.make_attribute(name, values, attr_type=onnx.AttributeProto.INTS)


def agreeing_attributes(model: onnx.ModelProto, data: st.DataObject, locations: list[str]) -> str:
    """A node whose attributes must agree with each other or with its operands, made not to."""
    graph = model.graph
    floats = [v.name for v in graph.input if v.type.tensor_type.elem_type == F]
    source = mutations._pick(data, floats, "source")
    if source is None:
        return "no float input"
    kind = data.draw(
        st.sampled_from(["Split", "Conv", "Pool", "Transpose", "Pad", "Squeeze", "Unsqueeze",
                         "ReduceSum", "DepthToSpace", "Concat", "Einsum", "Cast"]),
        label="kind",
    )  # fmt: skip
    ints = st.lists(st.sampled_from([-3, -2, -1, 0, 1, 2, 3, 4]), min_size=0, max_size=5)
    node = helper.make_node
    out = ["agree.out"]
    if kind == "Split":
        count = data.draw(st.integers(1, 4), label="outputs")
        num = data.draw(st.integers(0, 5), label="num_outputs")
        out = [f"agree.{i}" for i in range(count)]
        made = node("Split", [source], out, axis=0, num_outputs=num)
    elif kind == "Conv":
        made = node("Conv", [source, source], out, group=data.draw(st.integers(0, 3)))
        for name in ("kernel_shape", "pads", "strides"):
            made.attribute.append(_ints(name, data.draw(ints, label=name)))
    elif kind == "Pool":
        op = data.draw(st.sampled_from(["MaxPool", "AveragePool", "LpPool"]), label="op")
        made = node(op, [source], out)
        for name in ("kernel_shape", "pads", "strides", "dilations"):
            made.attribute.append(_ints(name, data.draw(ints, label=name)))
    elif kind == "Transpose":
        made = node("Transpose", [source], out)
        made.attribute.append(_ints("perm", data.draw(ints, label="perm")))
    elif kind == "Pad":
        pads = numpy_helper.from_array(np.array(data.draw(ints, label="pads"), np.int64), "ap")
        graph.initializer.append(pads)
        mode = data.draw(st.sampled_from(["constant", "reflect", "edge", "wrap"]), label="mode")
        made = node("Pad", [source, "ap"], out, mode=mode)
    elif kind in ("Squeeze", "Unsqueeze", "ReduceSum"):
        axes = numpy_helper.from_array(np.array(data.draw(ints, label="axes"), np.int64), "aa")
        graph.initializer.append(axes)
        made = node(kind, [source, "aa"], out)
    elif kind == "DepthToSpace":
        made = node("DepthToSpace", [source], out, blocksize=data.draw(st.integers(0, 3)),
                    mode=data.draw(st.sampled_from(["DCR", "CRD", "XYZ"])))  # fmt: skip
    elif kind == "Concat":
        made = node("Concat", [source, source], out, axis=data.draw(st.integers(-5, 5)))
    elif kind == "Einsum":
        equation = data.draw(st.sampled_from(["ij->ji", "ij,jk->ik", "i->", "ii->i", "ab->c",
                                              "...i->i", "ij", "->", "iij->j"]))  # fmt: skip
        made = node("Einsum", [source], out, equation=equation)
    else:
        made = node("Cast", [source], out, to=data.draw(st.sampled_from([0, 8, 16, 25, 99])))
    graph.node.append(made)
    for name in out:
        mutations._output(graph, name)
    _float_outputs(model)
    return f"{kind} of {source!r}: {made.attribute}"


# The model-field and op mutations of fuzz_mutations that keep a model an inference model
# (no nest_gradient), less tensor_external (onnxruntime reads the bytes, with no folder for
# the data), and the mutations of this module.
MUTATIONS = [
    *(m for m in mutations.FIELD if m is not mutations.tensor_external),
    *(m for m in mutations.OP if m is not mutations.nest_gradient),
    constant_to_feed, constant_to_feed, future_opset, packed_tensor, subgraph_signature,
    agreeing_attributes, agreeing_attributes,
]  # fmt: skip


def _inference(model: onnx.ModelProto) -> None:
    """The model made an inference model: no training_info, no training ops or opset."""
    del model.training_info[:]
    keep = [n for n in model.graph.node if n.domain != TRAINING]
    del model.graph.node[:]
    model.graph.node.extend(keep)


def ort_run(blob: bytes, feeds: dict[str, np.ndarray]) -> tuple[list[Any] | None, str | None]:
    """onnxruntime's outputs, or None and its message (it refused)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    # No graph optimizations: they may fold away or fuse a node onnxruntime would refuse.
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = onnxruntime.InferenceSession(
            blob, sess_options=options, providers=["CPUExecutionProvider"]
        )
        names = [i.name for i in session.get_inputs()]
        return session.run(None, {k: v for k, v in feeds.items() if k in names}), None
    except Exception as error:  # every refusal of onnxruntime, whatever its class
        return None, f"{type(error).__name__}: {error}"


def compare(ours: list[Any], theirs: list[Any]) -> str | None:
    """Where the outputs differ (shape, dtype, values), or None."""
    if len(ours) != len(theirs):
        return f"{len(ours)} outputs, onnxruntime {len(theirs)}"
    for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {index}: {a.dtype}{list(a.shape)}, onnxruntime {b.dtype}{list(b.shape)}"
        if a.dtype.kind in "fc" and not (np.isfinite(a).all() and np.isfinite(b).all()):
            # Overflow (feeds of 1e30 through a Conv, say) gives inf or nan by the order of
            # the sums, which differs between XLA and onnxruntime: values not compared
            continue
        if a.dtype.kind in "fc":
            close = np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-3, atol=1e-4,
                                equal_nan=True)  # fmt: skip
        else:
            close = np.array_equal(a, b)
        if not close:
            return f"output {index}: values differ: {a.ravel()[:8]} vs {b.ravel()[:8]}"
    return None


class Finding(AssertionError):
    """onnxruntime refused where we gave a result (or, with ``compare``, the results differ)."""


def differential_case(
    data: st.DataObject,
    note: Callable[[str], None],
    *,
    compare_outputs: bool = False,
    odd_feeds: bool = True,
) -> str:
    """One example: an inference seed, mutations, feeds; ours against onnxruntime's."""
    _note = note  # the driver's (fuzz_models run as __main__ is another module than tests.support.fuzz_models)
    name = data.draw(st.sampled_from(sorted(seeds())), label="seed")
    model = onnx.ModelProto.FromString(seeds()[name])
    _note(f"seed: {name}")
    for _ in range(data.draw(st.integers(0, 2), label="mutations")):
        mutate = data.draw(st.sampled_from(MUTATIONS), label="mutation")
        _note(f"{mutate.__name__}: {mutate(model, data, [])}")
    _inference(model)
    blob = model.SerializeToString()
    feeds = draw_feeds(model, data, mistype=odd_feeds)
    _note(
        "feeds: "
        + ", ".join(f"{k}={v.dtype}{list(v.shape)} {v.ravel()[:6]}" for k, v in feeds.items())
    )
    _note("calling backend.prepare(...).run(feeds)")
    try:
        ours = list(backend.prepare(blob).run(dict(feeds)))
    except DOCUMENTED as error:
        _note(f"ours refused: {type(error).__name__}: {str(error)[:200]}")
        return "refused"
    _note("calling onnxruntime")
    theirs, refusal = ort_run(blob, feeds)
    if refusal is not None:
        if _lacks(refusal, model):
            _note(f"onnxruntime lacks it: {refusal[:300]}")
            return "onnxruntime lacks"
        shapes = [f"{np.asarray(o).dtype}{list(np.shape(o))}" for o in ours]
        raise Finding(f"onnxruntime refused, ours gave {shapes}: {refusal[:600]}")
    assert theirs is not None
    if compare_outputs:
        difference = compare(ours, theirs)
        if difference is not None:
            raise Finding(f"outputs differ: {difference}")
    return "both"
