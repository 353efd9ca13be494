"""Test configuration: strict dtype promotion, float64 on demand, hypothesis profiles."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "standard_promotion: run with JAX's standard dtype promotion (for tests that call "
        "optax built-ins, which are not clean under strict promotion)",
    )


@pytest.fixture(autouse=True)
def _strict_promotion(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every implicit dtype promotion in our code is an error in the tests."""
    mode = "standard" if request.node.get_closest_marker("standard_promotion") else "strict"
    with jax.numpy_dtype_promotion(mode):
        yield


@pytest.fixture(params=["float32", "float64"])
def dtype(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test in float32 and in float64 (with 64-bit JAX enabled for it)."""
    if request.param == "float64":
        with jax.enable_x64(True):
            yield request.param
    else:
        yield request.param
