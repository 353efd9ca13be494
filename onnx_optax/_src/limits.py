"""Every limit on what a stranger's model or file may ask for, each written once.

A model is checked against :class:`Limits` when it is loaded (``graph/load.py``), and its
graph against the same values while it is traced (``graph``); a user raises one
with ``limits=Limits(nodes=...)``. The module constants below are the defaults the
rest of the package reads (the op registry's largest tensor, the ``.npz`` reader's
bytes, the CLI's own files). This module imports nothing of the package: every
other module may read it.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_COUNT",
    "MAX_GRADIENT_DEPTH",
    "MAX_LOG_BYTES",
    "MAX_LOG_LINE",
    "MAX_POSITION_CHARS",
    "MAX_SUBGRAPH_DEPTH",
    "MAX_TENSOR_BYTES",
    "MAX_TRACED_NODES",
    "Limits",
]


class Limits(NamedTuple):
    """How large a model may be; raise one with ``limits=Limits(nodes=...)``."""

    nodes: int = 200_000  # nodes in all graphs together
    node_inputs: int = 100_000  # inputs of one node (an optimizer node: 3-4 per tensor)
    # Inputs, or outputs, of one node of an ai.onnx or ai.onnx.ml op (Concat, Sum, Split):
    # XLA compiles each as its own operand or kernel, in time and memory that grow faster
    # than the count (a Split into 1,000 outputs: 6 s and 0.9 GB; 5,000: 67 s and 3.8 GB;
    # 20,000: std::bad_alloc, an abort). Optimizer nodes pack theirs (node_inputs bounds them).
    op_width: int = 1024
    file_bytes: int = 2**31 - 1  # the serialized model (protobuf's own limit)
    # Declared bytes of all tensors together; also the most bytes one tensor a node
    # computes may take (checked before numpy allocates it or XLA is handed its shape),
    # and the most bytes read from one .npz file.
    tensor_bytes: int = 16 * 2**30
    # Node runs one trace of a graph makes, a node inside a Gradient counted 3 times per
    # level of Gradient around it (nested Gradients grow 3x a level); refused before tracing.
    traced_nodes: int = 1_000_000
    # Nodes on the longest chain a Gradient differentiates (a nested Gradient counts twice
    # its own: forward and backward), refused before tracing. XLA:CPU compiles a backward
    # pass in time that grows faster than its depth, even in fusions cut to BARRIER_DEPTH
    # nodes (remat.run_bounded): Sin chains of 2,000, 4,000 and 8,000 nodes took 6.5, 19.5
    # and 119 s; 20,000 unbarred ended the process (SIGSEGV after 4 minutes).
    gradient_depth: int = 4096


DEFAULT_LIMITS = Limits()
MAX_TENSOR_BYTES = DEFAULT_LIMITS.tensor_bytes
MAX_TRACED_NODES = DEFAULT_LIMITS.traced_nodes
MAX_GRADIENT_DEPTH = DEFAULT_LIMITS.gradient_depth

# Subgraphs (If's branches, Loop's and Scan's bodies) nested deeper than this are refused
# (protobuf's own parser stops near 33: a graph, node and attribute are 3 of its 100 levels).
# Each body is traced once wherever it runs (lax.cond, lax.scan, lax.while_loop), so a
# node with subgraphs counts 1 plus their nodes: nesting adds work, it never multiplies it.
MAX_SUBGRAPH_DEPTH = 16

# What `onnx-optax train` reads back from its own files is a stranger's too (a model or
# a log someone sent): each value is checked where it is read, against these bounds.
# Counts (steps, epochs, rows, batch size, seed): int64, as T and a session's seed.
MAX_COUNT = 2**63 - 1
# Characters of the position's JSON: a few hundred, plus the names of --batch-axis.
MAX_POSITION_CHARS = 2**20
# Bytes of a log read back on resume (a row is about 100 bytes), and of one of its lines.
MAX_LOG_BYTES = 2**28
MAX_LOG_LINE = 2**12
