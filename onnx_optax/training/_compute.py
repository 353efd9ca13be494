"""``attach(compute_dtype="bfloat16")``: a float32 model computing in bfloat16 on float32 masters.

The inference graph is rewritten to compute in bfloat16: each float32 graph
input is cast to bfloat16 as the graph begins and each float32 output cast back
to float32 as it ends (the loss reads float32); every other float32 tensor is
bfloat16: stored initializers rounded to nearest even, ``Constant`` and
``ConstantOfShape`` values, ``Cast(to=FLOAT)`` now to BFLOAT16, value_info.
Each trained weight ``W`` keeps its float32 value as the initializer
``W.master``, read through ``Cast(W.master) -> W``: the Gradient and the
optimizer run on the float32 masters (as ``master_dtype`` does for 16-bit models:
:func:`master_weights`, the same rewrite of a 16-bit model's trained weights).
A stored value that every op reading it takes as float32 only (Resize's
``scales``, by the op's schema) stays float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_optax._src.onnx_nodes import describe
from onnx_optax._src.onnx_tensors import read_tensor, tensor_dtype
from onnx_optax.training._model import Names

FLOAT, BF16 = TensorProto.FLOAT, TensorProto.BFLOAT16


def _bf16(tensor: onnx.TensorProto, name: str) -> onnx.TensorProto:
    """A float32 tensor as bfloat16 (rounded to nearest even), named ``name``."""
    value = read_tensor(tensor, "a float32 tensor").astype(ml_dtypes.bfloat16)
    return numpy_helper.from_array(value, name)


def _rewrite_node(node: onnx.NodeProto) -> None:
    """``node``'s own float32 values and Cast targets as bfloat16, in place."""
    for attribute in node.attribute:
        if attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            raise ValueError(
                f"compute_dtype: {describe(node)} holds a subgraph, which compute_dtype does "
                "not rewrite; leave compute_dtype out for this model"
            )
        if attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == FLOAT:
            attribute.t.CopyFrom(_bf16(attribute.t, attribute.t.name))
        elif node.op_type == "Cast" and attribute.name == "to" and attribute.i == FLOAT:
            attribute.i = BF16
        elif attribute.name == "dtype" and attribute.i == FLOAT:
            raise ValueError(
                f"compute_dtype: {describe(node)} makes float32 values (dtype attribute), "
                "which compute_dtype does not rewrite; leave compute_dtype out for this model"
            )


def _takes_bfloat16(node: onnx.NodeProto, position: int, opset: int) -> bool:
    """Whether input ``position`` of ``node``'s schema (at ``opset``) allows bfloat16."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return True  # no schema: left to the node's own check
    if not schema.inputs:
        return True
    formal = schema.inputs[min(position, len(schema.inputs) - 1)]
    allowed = next(
        (
            c.allowed_type_strs
            for c in schema.type_constraints
            if c.type_param_str == formal.type_str
        ),
        [formal.type_str],
    )
    return "tensor(bfloat16)" in allowed


def _float32_only(graph: onnx.GraphProto, opset: int) -> set[str]:
    """The tensors every reader of which takes float32 and not bfloat16 (Resize's scales)."""
    takes: dict[str, set[bool]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name:
                takes.setdefault(name, set()).add(_takes_bfloat16(node, position, opset))
    return {name for name, kinds in takes.items() if kinds == {False}}


def _rename_everywhere(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        node.input[:] = [new if n == old else n for n in node.input]
        node.output[:] = [new if n == old else n for n in node.output]


def to_bfloat16(model: onnx.ModelProto, trained: Sequence[str], names: Names) -> list[str]:
    """Rewrites ``model`` (in place) to compute in bfloat16; returns the masters' names.

    Raises:
      ValueError: the model has float tensors other than float32 (a float16 or
        float64 model), or a node compute_dtype cannot rewrite (a subgraph, a
        ``dtype`` attribute making float32), named.
    """
    graph = model.graph
    kinds = {v.type.tensor_type.elem_type for v in (*graph.input, *graph.output)}
    kinds |= {i.data_type for i in graph.initializer}
    other = kinds & {TensorProto.FLOAT16, TensorProto.DOUBLE, BF16}
    if other:
        raise ValueError(
            "compute_dtype='bfloat16' takes a float32 model; this one has "
            f"{sorted(TensorProto.DataType.Name(k) for k in other)} tensors"
        )
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    kept = _float32_only(graph, opset)  # stored values some op takes as float32 only
    for node in graph.node:
        if not set(node.output) <= kept or node.op_type not in ("Constant", "ConstantOfShape"):
            _rewrite_node(node)
    begin: list[onnx.NodeProto] = []
    end: list[onnx.NodeProto] = []
    stored = {i.name for i in graph.initializer}
    for value in graph.input:
        if value.type.tensor_type.elem_type == FLOAT and value.name not in stored:
            cast = names(f"{value.name}.bf16")
            _rename_everywhere(graph, value.name, cast)
            begin.append(helper.make_node("Cast", [value.name], [cast], to=BF16))
    for value in graph.output:
        if value.type.tensor_type.elem_type == FLOAT:
            cast = names(f"{value.name}.bf16")
            _rename_everywhere(graph, value.name, cast)
            end.append(helper.make_node("Cast", [cast], [value.name], to=FLOAT))
    masters = {}
    for index, init in enumerate(graph.initializer):
        if init.data_type != FLOAT or init.name in kept:
            continue
        if init.name in trained:
            master = names(f"{init.name}.master")
            begin.append(helper.make_node("Cast", [master], [init.name], to=BF16))
            masters[init.name] = master
            init.name = master
        else:
            graph.initializer[index].CopyFrom(_bf16(init, init.name))
    for info in graph.value_info:
        if info.type.tensor_type.elem_type == FLOAT:
            info.type.tensor_type.elem_type = BF16
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend([*begin, *nodes, *end])
    return [masters[n] for n in trained if n in masters]


def master_weights(
    graph: onnx.GraphProto, chosen: list[str], master_dtype: Any, names: Names
) -> list[str]:
    """Each trained 16-bit weight ``W`` as a wider master initializer and ``Cast(master) -> W``.

    Changes ``graph`` in place and returns the masters' names, in ``chosen``'s
    order: the inference graph reads ``W`` as before, now computed by a Cast
    node at its beginning, so it computes in the weight's own dtype.
    """
    try:
        master = np.dtype(master_dtype)
    except TypeError:
        raise TypeError(
            f"master_dtype must be a float dtype such as 'float32'; got {master_dtype!r}"
        ) from None
    if master not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"master_dtype must be float32 or float64; got {master}")
    inputs = {v.name for v in graph.input}
    position = {init.name: i for i, init in enumerate(graph.initializer)}
    masters, casts = [], []
    for n in chosen:
        init = graph.initializer[position[n]]
        dtype = tensor_dtype(init.data_type, f"initializer '{n}'")
        if dtype.itemsize >= master.itemsize:
            raise ValueError(
                f"master_dtype={master} keeps a wider copy of 16-bit weights, but the trained "
                f"tensor '{n}' is {dtype}; leave master_dtype out"
            )
        if n in inputs:
            raise ValueError(
                f"the trained tensor '{n}' is also a graph input (a default value a feed may "
                "replace), which a master weight cannot be; remove it from the graph's inputs"
            )
        name = names(f"{n}.master")
        value = read_tensor(init, "graph initializer").astype(master)
        init.CopyFrom(numpy_helper.from_array(value, name))
        casts.append(
            helper.make_node(
                "Cast",
                [name],
                [n],
                to=int(helper.np_dtype_to_tensor_dtype(dtype)),
                name=names(f"{n}.cast"),
            )
        )
        masters.append(name)
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend([*casts, *nodes])
    return masters
