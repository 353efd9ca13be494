"""A graph's run whose values are all small is compiled without XLA:CPU's loop
partitioning (``SizedJit``); larger graphs keep it.

The expected sizes are the shapes' bytes counted by hand, the expected outputs numpy's.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

pytest.importorskip("onnx")

from onnx import TensorProto, helper

from onnx_optax import backend
from onnx_optax._src.graph import jit as graph

cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="an XLA:CPU option")


def _partitions(compiled_text: str) -> list[str]:
    """The loop partitions XLA:CPU's compiled program names (empty lists left out)."""
    found = re.findall(r'"outer_dimension_partitions":\[([^\]]*)\]', compiled_text)
    return [p for p in found if p]


def test_largest_value_reads_loop_bodies() -> None:
    def body(carry: jax.Array, row: jax.Array) -> tuple[jax.Array, None]:
        outer = jnp.outer(row, jnp.ones(512, jnp.float32))  # [1024, 512] inside the body
        return carry + outer.sum(), None

    def f(rows: jax.Array) -> jax.Array:
        return lax.scan(body, jnp.zeros((), jnp.float32), rows)[0]

    jaxpr = jax.make_jaxpr(f)(jnp.zeros((3, 1024), jnp.float32))
    assert graph.largest_value(jaxpr) == 1024 * 512 * 4
    flat = jax.make_jaxpr(lambda x: (x * 2).astype(jnp.int8))(jnp.zeros((10, 7), jnp.float32))
    assert graph.largest_value(flat) == 10 * 7 * 4
    # inputs do not count (a model's weights), random keys do
    summed = jax.make_jaxpr(jnp.sum)(jnp.zeros((1000, 300), jnp.float32))
    assert graph.largest_value(summed) == 4
    keys = jax.make_jaxpr(lambda: jax.random.split(jax.random.key(0), 5000))()
    assert graph.largest_value(keys) == 5000 * jax.random.key(0).dtype.itemsize


@cpu_only
def test_the_small_graph_options_turn_the_loop_partitioning_off() -> None:
    """Were the pass renamed, XLA would ignore the option silently: this fails then."""
    x = jnp.ones((256, 512), jnp.float32)  # 512 KB read, 512 KB written: partitioned

    def compiled(options: dict[str, object]) -> str:
        jitted = jax.jit(lambda x: jnp.maximum(x, 0), compiler_options=options)
        return jitted.lower(x).compile().as_text()

    assert _partitions(compiled(graph.CPU_COMPILER_OPTIONS))
    assert not _partitions(compiled({**graph.CPU_COMPILER_OPTIONS, **graph.SMALL_GRAPH_OPTIONS}))


def _relu(rows: int | str) -> object:
    """Relu on [rows, 512] (``rows`` a name: any number of rows)."""
    shape = [rows, 512]
    node = helper.make_node("Relu", ["x"], ["y"])
    g = helper.make_graph(
        [node],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@cpu_only
@pytest.mark.parametrize("rows, small", [(256, True), (1024, False)])
def test_a_run_is_compiled_by_the_size_of_its_values(rows: int, small: bool) -> None:
    x = np.random.default_rng(0).standard_normal((rows, 512)).astype(np.float32)
    rep = backend.prepare(_relu(rows))
    np.testing.assert_array_equal(rep.run([x])[0], np.maximum(x, 0))
    ((sized, _),) = rep.graph._compilations.values()
    expected = sized._small if small else sized._default
    assert list(sized._chosen.values()) == [expected]
    assert sized._small is not sized._default
    assert rep.graph.compilations == 1


@cpu_only
def test_the_choice_is_made_for_each_shape_of_the_feeds() -> None:
    """A graph of small values at one batch and large ones at another: each shape of the
    feed is compiled as its own size calls for, and a shape seen again keeps its choice."""
    rep = backend.prepare(_relu("N"))
    rng = np.random.default_rng(1)
    for rows in (1024, 256, 1024):
        x = rng.standard_normal((rows, 512)).astype(np.float32)
        np.testing.assert_array_equal(rep.run([x])[0], np.maximum(x, 0))
    ((sized, _),) = rep.graph._compilations.values()
    chosen = {key[1][0][0]: jitted for key, jitted in sized._chosen.items()}
    assert chosen == {(1024, 512): sized._default, (256, 512): sized._small}
    assert rep.graph.compilations == 2
