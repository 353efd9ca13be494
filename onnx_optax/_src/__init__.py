"""Implementation modules of onnx_optax; import the public names from ``onnx_optax``."""
