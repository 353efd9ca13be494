"""Errors in the call itself, explained for optax and PyTorch users.

:func:`explain_arguments` decorates each operator's public factory and op: a call that
does not bind to the signature names the public function, the ONNX name of an argument
that optax or PyTorch call otherwise, and what the function takes.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["explain_arguments"]


# Names other libraries use, and what they are called here.
_OTHER_NAMES = {
    "b1": "alpha",
    "b2": "beta",
    "eps": "epsilon",
    "momentum": "alpha",
    "dampening": "beta (= 1 - dampening)",
    "weight_decay": "norm_coefficient",
    "lr_decay": "decay_factor",
    "nesterov": "mode='nesterov' (or onnx_optax.nesterov)",
    "mu_dtype": "accumulator_dtype",
    "lr": "learning_rate (the first argument)",
}
_MOMENTUM_EQUIVALENTS = (
    "ONNX Momentum has no defaults for alpha, beta and norm_coefficient: "
    "optax.sgd(lr, momentum=m) is alpha=m, beta=1.0, norm_coefficient=0.0; "
    "torch.optim.SGD(lr, momentum=m, dampening=d, weight_decay=w) is alpha=m, beta=1-d, "
    "norm_coefficient=w"
)


def explain_arguments(public_name: str) -> Callable[[Any], Any]:
    """Decorates a public function so that a wrong call names it and says what to pass.

    Only a call that does not bind to the signature is re-raised (with the
    public name and, for a name used by optax or PyTorch, the ONNX name);
    nothing is checked on the success path.
    """

    def decorate(function: Any) -> Any:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except TypeError as error:
                try:
                    signature.bind(*args, **kwargs)
                except TypeError:
                    message = str(error).replace(f"{function.__name__}()", f"{public_name}()")
                    if not message.startswith(public_name):
                        message = f"{public_name}(): {message}"
                    hints = [
                        f"{name} is called {_OTHER_NAMES[name]} here"
                        for name in kwargs
                        if name not in signature.parameters and name in _OTHER_NAMES
                    ]
                    alpha = signature.parameters.get("alpha")
                    if "missing" in message and alpha and alpha.default is alpha.empty:
                        hints.append(_MOMENTUM_EQUIVALENTS)
                    known = ", ".join(signature.parameters)
                    raise TypeError(
                        f"{message}. "
                        + "; ".join(hints)
                        + ("; " if hints else "")
                        + f"it takes {known}"
                    ) from None
                raise

        return call

    return decorate
