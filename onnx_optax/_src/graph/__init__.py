"""The graph core: load (one checked way in) -> passes -> lowering -> run.

Transitional: the interpreter is being split into the pipeline's stages.
"""

from onnx_optax._src.graph.interpreter import *  # noqa: F403
