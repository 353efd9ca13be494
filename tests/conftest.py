"""Test configuration: strict dtype promotion, float64 on demand, hypothesis profiles."""

from __future__ import annotations

import os
from collections.abc import Iterator

import jax
import pytest
from hypothesis import HealthCheck, settings

import onnx_optax

# Property-based tests: a fixed, derandomized profile for CI, and a long one to run
# by hand on a new device or JAX version: HYPOTHESIS_PROFILE=long pytest tests/optimizers/test_properties.py
settings.register_profile(
    "ci",
    max_examples=30,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long",
    max_examples=1500,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    # The suite's own process runs as the onnx-optax command does (importing changes nothing).
    onnx_optax.reuse_host_memory()
    config.addinivalue_line(
        "markers",
        "slow: minutes and many GiB (a model above 2 GiB); left out unless `pytest -m slow`",
    )
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


@pytest.fixture(autouse=True)
def _no_rank_promotion() -> Iterator[None]:
    """Implicit rank promotion (broadcasting a vector against a matrix) is an error too."""
    with jax.numpy_rank_promotion("raise"):
        yield
