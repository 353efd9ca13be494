"""Training an ONNX model from its own ``training_info`` (TrainingInfoProto).

* :func:`attach`: an inference model plus a loss and an onnx_optax optimizer
  as a complete training model (loss, ``Gradient``, optimizer node, ``T + 1``
  and every binding in ``training_info``; the inference graph untouched).
* :mod:`~onnx_optax.training.schedules`: optax's learning-rate schedules
  that write themselves as ONNX ops computing R from T, so a trained model
  carries its recipe (``attach(..., clip_global_norm=)`` does the same for
  gradient clipping).
* :func:`plan`: every tensor the model stores, whether ``attach`` trains it
  and why (weights, exporter constants, hyperparameters, Constant nodes it
  lifts, running statistics, ...).
* :func:`batches`: one epoch of arrays as batches, shuffled in an order that
  depends only on ``(seed, epoch)``, so a resumed run continues exactly.
* :func:`check`: everything the ONNX checker does not validate about
  ``training_info`` (bindings, Gradient, optimizer state, T), as messages.
* :class:`Session`: runs the initialization graphs and then algorithm steps,
  each ``training_info`` entry compiled once into one jitted XLA computation
  on the *combined* graph (the inference graph followed by the algorithm), its
  state donated, on one device or split over several (``devices=``);
  :meth:`Session.evaluate` computes the loss without a step,
  :meth:`Session.to_model` and :meth:`Session.save` write the trained model
  back, :meth:`Session.to_inference_model` only what inference reads, and
  :meth:`Session.set_learning_rate` (or :attr:`Session.learning_rate_scale`)
  changes R between steps, keeping V, H and T.

State (parameters, V, H, T) lives in initializers, so ``Session(session.to_model())``
continues bit-identically.

Example:
  >>> import numpy as np, onnx_optax
  >>> from onnx import TensorProto, helper, numpy_helper
  >>> from onnx_optax import training
  >>> w = numpy_helper.from_array(np.zeros((3, 2), np.float32), "w")
  >>> graph = helper.make_graph(
  ...     [helper.make_node("MatMul", ["x", "w"], ["y"])], "linear",
  ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
  ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])], initializer=[w])
  >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
  >>> trainable = training.attach(model, loss="mse", target="t", optimizer=onnx_optax.adam(0.1))
  >>> training.check(trainable)
  []
  >>> session = training.Session(trainable)
  >>> x, t = np.ones((4, 3), np.float32), np.ones((4, 2), np.float32)
  >>> float(session.step({"x": x, "t": t})["loss"])
  1.0
  >>> print(session.initializers["w"].round(3))
  [[0.1 0.1]
   [0.1 0.1]
   [0.1 0.1]]

Needs the ``onnx`` extra (``pip install "onnx-optax[onnx]"``, from a clone
``pip install ".[onnx]"``).
"""

from onnx_optax._src.extras import missing_extra

try:
    import onnx  # noqa: F401
except ImportError as _error:
    raise missing_extra("onnx_optax.training", "onnx", _error) from _error

from onnx_optax.training import schedules
from onnx_optax.training._attach import attach
from onnx_optax.training._batches import batches
from onnx_optax.training._check import Problem, check
from onnx_optax.training._losses import LOSSES
from onnx_optax.training._model import TrainingModelError, load
from onnx_optax.training._plan import Plan, Tensor, plan
from onnx_optax.training._session import Session

__all__ = [
    "LOSSES",
    "Plan",
    "Problem",
    "Session",
    "Tensor",
    "TrainingModelError",
    "attach",
    "batches",
    "check",
    "load",
    "plan",
    "schedules",
]
