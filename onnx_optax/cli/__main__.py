"""``python -m onnx_optax.cli``: the ``onnx-optax`` command line."""

import sys

from onnx_optax.cli import main

if __name__ == "__main__":
    sys.exit(main())
