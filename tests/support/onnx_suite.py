"""Which of ONNX's own backend cases run on onnx_optax, and why the others do not.

The official runner (``onnx.backend.test.BackendTest``) holds every case; this
module picks four sets from it:

(a) training: the 7 optimizer node cases and the 2 Gradient model cases;
(b) node: every node case of an op in the registry, any of its domains (an
    ``_expanded`` case goes with the op of its unexpanded twin);
(c) pytorch: the ``pytorch-converted`` and ``pytorch-operator`` model cases;
(d) sequence: the simple model cases of sequence ops (``SEQUENCE_MODEL``).

A case is left out only by a pattern in ``EXCLUDED`` with its reason, and an op the
registry lacks is named in ``NOT_REGISTERED`` with its reason (a test keeps that list
exact). The cases run with 64-bit JAX: ONNX cases use int64 and double throughout.

Count them (prints pass/total per set)::

    .venv/bin/python -m tests.support.onnx_suite
"""

from __future__ import annotations

import functools
import re
import unittest
import warnings
from collections.abc import Callable
from typing import Any

import jax

# ONNX's own cases of the training domain, written out here (not read from the package).
OPTIMIZER_CASES = (
    "test_adagrad",
    "test_adagrad_multiple",
    "test_adam",
    "test_adam_multiple",
    "test_momentum",
    "test_nesterov_momentum",
    "test_momentum_multiple",
)
TRAINING_CASES = (*OPTIMIZER_CASES, "test_gradient_of_add", "test_gradient_of_add_and_mul")
# ONNX's simple model cases of sequence ops (OnnxBackendSimpleModelTest).
SEQUENCE_MODEL = r"^test_sequence_model\d+$"

# pattern (searched in the case name) -> why the case does not run
EXCLUDED: dict[str, str] = {
    r"^test_cast(like)?_.*_to_FLOAT8E8M0(_expanded)?$": (
        "casts to FLOAT8E8M0 (its rounding modes) are not implemented"
    ),
    r"^test_training_dropout(?!_zero_ratio)": (
        "Dropout's masks in training mode are numpy's random draws, which JAX's do not repeat"
    ),
    r"^test_equal_string": "string tensors (XLA has no strings)",
    r"^test_ai_onnx_ml_label_encoder_": "string keys and inputs (XLA has no strings)",
    r"^test_loop16_seq_none$": (
        "onnx's runner cannot compare a sequence holding a scalar (len() of a 0-d array); "
        "tests/ops/test_sequence.py checks its values"
    ),
}


# op type -> why the node cases of an op the registry lacks do not run (the training
# domain's three optimizers run in the training set, by the graph itself).
NOT_REGISTERED: dict[str, str] = {
    "Adagrad": "run in the training set (the training domain's ops are the graph's own)",
    "Adam": "run in the training set (the training domain's ops are the graph's own)",
    "Momentum": "run in the training set (the training domain's ops are the graph's own)",
    "Bernoulli": "random draws: its cases expect numpy's, which JAX's do not repeat",
    "ImageDecoder": "decodes encoded image bytes (JPEG, PNG, ...), which XLA cannot",
    "RegexFullMatch": "string tensors (XLA has no strings)",
    "StringConcat": "string tensors (XLA has no strings)",
    "StringNormalizer": "string tensors (XLA has no strings)",
    "StringSplit": "string tensors (XLA has no strings)",
}


def unregistered_node_ops() -> dict[str, int]:
    """Op types of the node cases that the registry lacks, with their number of cases."""
    from onnx.backend.test.loader import load_node_model_tests

    from onnx_optax._src.ops import REGISTRY

    counts: dict[str, int] = {}
    cases = load_node_model_tests()
    ops = {c.name: {(n.domain, n.op_type) for n in c.model.graph.node} for c in cases}
    for name, found in ops.items():
        for domain, op_type in ops.get(_base(name), found):
            if op_type not in REGISTRY.get("" if domain == "ai.onnx" else domain, {}):
                counts[op_type] = counts.get(op_type, 0) + 1
                break
    return counts


def exclusion(name: str) -> str | None:
    for pattern, reason in EXCLUDED.items():
        if re.search(pattern, name):
            return reason
    return None


def _base(name: str) -> str:
    return re.sub(r"_expanded(_ver\d+)?$", "", name)


def registered_node_cases() -> list[str]:
    """Names of the node cases whose op is in the registry."""
    from onnx.backend.test.loader import load_node_model_tests

    from onnx_optax._src.ops import REGISTRY

    def registered(domain: str, op_type: str) -> bool:
        return op_type in REGISTRY.get("" if domain == "ai.onnx" else domain, {})

    cases = load_node_model_tests()
    ops = {c.name: {(n.domain, n.op_type) for n in c.model.graph.node} for c in cases}
    return sorted(
        name
        for name, found in ops.items()
        if all(registered(d, t) for d, t in ops.get(_base(name), found))
    )


def _x64(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with jax.enable_x64(True):
            return fn(*args, **kwargs)

    return run


@functools.cache
def backend_test() -> Any:
    """The official runner on onnx_optax.backend, built once per process (no include
    patterns: callers pick its test functions by name)."""
    from onnx.backend.test import BackendTest

    from onnx_optax.backend import OnnxOptaxBackend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # generating the node cases warns for unrelated ops
        return BackendTest(OnnxOptaxBackend, __name__)


@functools.cache
def suite_classes() -> dict[str, type[unittest.TestCase]]:
    """One unittest class per set, holding the runner's own test functions (CPU)."""
    runner = backend_test()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        node_names = set(registered_node_cases())
    items = runner.test_cases
    node = items["OnnxBackendNodeModelTest"]
    simple = items["OnnxBackendSimpleModelTest"]
    pytorch = [
        items["OnnxBackendPyTorchConvertedModelTest"],
        items["OnnxBackendPyTorchOperatorModelTest"],
    ]

    def pick(classes: list[type], keep: Callable[[str], bool]) -> dict[str, Any]:
        picked = {}
        for cls in classes:
            for attr in dir(cls):
                if attr.startswith("test_") and attr.endswith("_cpu") and keep(attr[:-4]):
                    fn = _x64(getattr(cls, attr))
                    reason = exclusion(attr[:-4])
                    picked[attr] = unittest.skip(reason)(fn) if reason else fn
        return picked

    training = pick([node, simple], lambda name: name in TRAINING_CASES)
    nodes = pick([node], lambda name: name in node_names and name not in TRAINING_CASES)
    models = pick(pytorch, lambda name: True)
    sequences = pick([simple], lambda name: re.search(SEQUENCE_MODEL, name) is not None)
    return {
        "training": type("OnnxTrainingCases", (unittest.TestCase,), training),
        "node": type("OnnxNodeCases", (unittest.TestCase,), nodes),
        "pytorch": type("OnnxPyTorchModelCases", (unittest.TestCase,), models),
        "sequence": type("OnnxSequenceModelCases", (unittest.TestCase,), sequences),
    }


def main() -> None:
    for label, cls in suite_classes().items():
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(cls)
        result = unittest.TestResult()
        suite.run(result)
        total = result.testsRun
        skipped = len(result.skipped)
        failed = len(result.failures) + len(result.errors)
        passed = total - skipped - failed
        print(
            f"({label}) {passed}/{total} pass ({100 * passed / total:.1f}%); "
            f"{skipped} excluded, {failed} failed; {passed}/{total - skipped} of those run"
        )
        for test, _ in result.failures + result.errors:
            print(f"    failed: {test.id()}")
    reasons: dict[str, int] = {}
    for cls in suite_classes().values():
        for attr in dir(cls):
            reason = exclusion(attr[:-4]) if attr.startswith("test_") else None
            if reason:
                reasons[reason] = reasons.get(reason, 0) + 1
    for reason, count in reasons.items():
        print(f"excluded {count}: {reason}")
    for op_type, count in sorted(unregistered_node_ops().items()):
        print(f"not registered {count}: {op_type}: {NOT_REGISTERED.get(op_type, '(no reason)')}")


if __name__ == "__main__":
    main()
