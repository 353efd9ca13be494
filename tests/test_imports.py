"""Every public name imports and is what the package says it is."""

from __future__ import annotations

import importlib

import pytest

import onnx_optax


@pytest.mark.parametrize("module", ["onnx_optax", "onnx_optax.ops"])
def test_all_names_import(module: str) -> None:
    imported = importlib.import_module(module)
    assert imported.__all__, module
    for name in imported.__all__:
        assert getattr(imported, name) is not None, f"{module}.{name}"


@pytest.mark.parametrize(
    "module",
    ["onnx_optax.backend", "onnx_optax.interop", "onnx_optax.training", "onnx_optax._src.ops"],
)
def test_onnx_modules_import(module: str) -> None:
    pytest.importorskip("onnx")
    imported = importlib.import_module(module)
    for name in imported.__all__:
        assert getattr(imported, name) is not None, f"{module}.{name}"


def test_factories_build_transformations() -> None:
    for factory in (onnx_optax.adagrad, onnx_optax.adam):
        assert callable(factory(0.1).update)
    for factory in (onnx_optax.momentum, onnx_optax.nesterov):
        assert callable(factory(0.1, alpha=0.9, beta=1.0, norm_coefficient=0.0).init)
