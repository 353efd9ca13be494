"""The ONNX ops, one registry (temporary: the one module nn.py holds them all)."""

from onnx_optax._src.ops.ml import ADVICE, ML_DOMAIN
from onnx_optax._src.ops.nn import (
    MAX_TENSOR_BYTES,
    OPS,
    REGISTRY,
    STANDARD_DOMAINS,
    Node,
    check_omitted_inputs,
    check_size,
    domain_of,
    find_op,
    is_static,
    read_attributes,
)

__all__ = [
    "ADVICE",
    "MAX_TENSOR_BYTES",
    "ML_DOMAIN",
    "OPS",
    "REGISTRY",
    "STANDARD_DOMAINS",
    "Node",
    "check_omitted_inputs",
    "check_size",
    "domain_of",
    "find_op",
    "is_static",
    "read_attributes",
]
