"""Running a graph: feeds checked, initializers and constants placed on a device once,
the graph jitted once per signature, run-time checks raised after the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from onnx_optax._src.graph.feeds import (
    declared_output,
    feed,
    host_array,
    refuse_unknown,
)
from onnx_optax._src.graph.jit import SizedJit, abstract, is_default, jit_graph, paused_gc
from onnx_optax._src.graph.packing import (
    PACK_BELOW,
    Layout,
    cut,
    materialize,
    outputs_of,
    pack,
    unpack,
)
from onnx_optax._src.graph.passes.prune import Dependencies
from onnx_optax._src.graph.steps import OptimizerStep, Step
from onnx_optax._src.graph.support import Env
from onnx_optax._src.onnx_nodes import (
    listed,
)
from onnx_optax._src.onnx_tensors import (
    tensor_dtype,
)
from onnx_optax._src.ops import (
    RunChecks,
    collect_run_checks,
    is_static,
    raise_failed,
)
from onnx_optax._src.ops.sequence import host_value

# Constants computed once per device hold at least this many bytes, or they are
# computed in the graph on each run (see Runner._constants_function).
HOISTED_BYTES = 1 << 20


class Runner:
    """A graph's compiled run, for :class:`GraphFunction` to inherit: feeds checked
    against their declared types, initializers packed and put on a device once, the
    constants computed once per device, the graph jitted once per packing of the feeds
    and values of the inputs read as shapes, and its run-time checks raised after it.

    It runs what the interpreter set: ``evaluate`` on ``_run_schedule``, with the values
    of ``_constant_steps`` (and the ``_transposed`` weights) computed ahead.
    """

    name: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    output_dtypes: tuple[np.dtype | None, ...]
    output_kinds: tuple[str | None, ...]
    input_types: dict[str, Any]
    value_types: dict[str, Any]
    static_inputs: tuple[str, ...]
    static: dict[str, Any]
    params: dict[str, Any]
    schedule: list[Step]
    edges: Dependencies
    _inputs: frozenset[str]
    _initializer_inputs: frozenset[str]
    _steps: dict[int, Step]
    _constant_steps: list[Step]
    _run_schedule: list[Step]
    _transposed: Mapping[str, str]

    def evaluate(
        self,
        env: Env,
        *,
        differentiable: bool = True,
        steps: Sequence[Step] | None = None,
        outputs: Sequence[str] | None = None,
    ) -> tuple[Any, ...]:
        raise NotImplementedError

    def prepare_run(self) -> None:
        """The caches of the compiled runs, and which initializers and feeds are packed."""
        # What ``_constants`` computed: on the host (once), on each device.
        self._host_constants: dict[str, Any] = {}
        self._device_constants: dict[Any, dict[str, jax.Array]] = {}
        self._constants_jit: Any = None
        # Small feeds and initializers that only optimizer nodes read (as tensors) are
        # packed, in the nodes' order, so each group of a node fills one stretch of a
        # buffer; a value another node reads would be sliced out, which XLA compiles
        # slowly by the thousand.
        optimizer_reads: dict[str, None] = {}
        other_reads: set[str] = set()
        for step in self._steps.values():
            first = 2 if isinstance(step, OptimizerStep) else len(step.inputs)
            optimizer_reads.update(dict.fromkeys(step.inputs[first:]))
            other_reads.update(step.inputs[:first])
        self._packable = tuple(n for n in optimizer_reads if n not in other_reads)
        self._packed_params: tuple[Layout, list[np.ndarray], dict[str, np.ndarray]] | None = None
        # The packed initializers on each device a call has named (None: the default one).
        self._device_params: dict[Any, tuple[list[jax.Array], dict[str, jax.Array]]] = {}
        self._params_shapes: tuple[Layout, list[Any], dict[str, Any]] | None = None
        self._compilations: dict[Any, tuple[Any, list[Layout]]] = {}

    def _constants(self, device: jax.Device | None) -> dict[str, Any]:
        """The values of ``_constant_steps``'s outputs that the other steps or the graph's
        outputs read, computed once per device (see ``_constants_function``)."""
        if device not in self._device_constants:
            function = self._constants_function()
            traced: dict[str, Any] = {}
            if function is not None:
                p_buffers, p_own = self._device_params[device]
                with paused_gc():
                    traced, checks = function(p_buffers, p_own)
                raise_failed(checks)
            self._device_constants[device] = traced
        return self._device_constants[device]

    def _constants_function(self) -> Any:
        """The jitted function of the initializers computing ``_constant_steps``'s outputs
        that the other steps or the graph's outputs read: those computed in JAX are
        returned; those computed on the host (shape data) go to ``_host_constants``,
        which the compiled graph reads while it is traced.

        None where what it would return holds less than HOISTED_BYTES: the steps are
        then put back in the graph's schedule (a second compilation would cost more
        than computing them on each run).
        """
        if self._constants_jit is not None or not (self._constant_steps or self._transposed):
            return self._constants_jit
        produced = {name for step in self._constant_steps for name in step.outputs if name}
        constant_ids = {id(step) for step in self._constant_steps}
        read = set(self.output_names)
        for index, step in self._steps.items():
            if id(step) not in constant_ids:
                read.update(self.edges.deps(index))
        wanted = sorted(produced & read)
        p_layout = self._params_layout()[0]

        def compute(
            p_buffers: list[Any], p_own: dict[str, Any]
        ) -> tuple[dict[str, Any], RunChecks]:
            env: Env = dict(self.static)
            env.update(unpack(p_layout, p_buffers))
            env.update(p_own)
            with collect_run_checks() as checks:
                self.evaluate(env, differentiable=False, steps=self._constant_steps, outputs=())
            traced = {}
            for name in wanted:
                value = materialize(env[name])
                if is_static(value):
                    self._host_constants[name] = value
                else:
                    traced[name] = value
            for name, transposed in self._transposed.items():
                traced[transposed] = jnp.transpose(materialize(env[name]))
            return traced, RunChecks.of(checks)

        shapes = jax.eval_shape(compute, *self._params_layout()[1:])[0]
        if sum(s.size * s.dtype.itemsize for s in shapes.values()) < HOISTED_BYTES:
            self._constant_steps, self._run_schedule = [], self.schedule
            self._host_constants.clear()
            return None
        self._constants_jit = jit_graph(compute, flat=False)
        return self._constants_jit

    def check_declared_shapes(self, graph: Any) -> None:
        """Traces the graph on the declared input shapes, when all are known, to fail early."""
        declared = {
            i.name: i.type.tensor_type for i in graph.input if i.type.HasField("tensor_type")
        }
        specs = {}
        for name in self.input_names:
            kind = declared.get(name)
            if kind is None or not kind.elem_type or not kind.HasField("shape"):
                return
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in kind.shape.dim]
            if any(d < 0 for d in dims):
                return
            try:
                dtype = tensor_dtype(kind.elem_type, f"graph input '{name}'")
            except ValueError:
                return
            # Stand-ins packed as the caller's arrays will be: zeros where small (a
            # buffer's part), shapes alone where large.
            size = int(np.prod(dims))
            specs[name] = (
                np.zeros(dims, dtype)
                if size < PACK_BELOW
                else jax.ShapeDtypeStruct(dims, jax.dtypes.canonicalize_dtype(dtype))
            )
        layout, buffers, own = pack(specs, self._packable)
        p_buffers, p_own = self._params_layout()[1:]
        function = self._constants_function()
        constants = {} if function is None else jax.eval_shape(function, p_buffers, p_own)[0]
        arguments = jax.tree.map(abstract, (buffers, own, p_buffers, {**p_own, **constants}))
        try:
            # The jitted function a first call of these shapes runs: JAX keeps this trace
            # for it, so the graph is traced once for both.
            self._compiled({}, layout)[0].trace(*arguments)
        except (TypeError, ValueError) as error:
            # Optimizer nodes check their arguments when they run (declared shapes of
            # optimizer inputs are not binding); everything else fails here.
            if not getattr(error, "optimizer_node", False):
                raise

    def __call__(self, inputs: Any, device: jax.Device | None = None) -> list[np.ndarray]:
        if isinstance(inputs, Mapping):
            odd = [name for name in inputs if not isinstance(name, str)]
            if odd:
                raise TypeError(
                    f"input names must be str, got {listed(odd)}; the graph takes "
                    f"{listed(self.input_names)}"
                )
            missing = [name for name in self.input_names if name not in inputs]
            if missing:
                raise ValueError(
                    f"missing input(s) {listed(missing)}; the graph takes "
                    f"{listed(self.input_names)}"
                )
            if len(inputs) != len(self.input_names):
                refuse_unknown(inputs, self.input_names, self._initializer_inputs)
            values = [inputs[name] for name in self.input_names]
        else:
            values = list(inputs) if isinstance(inputs, list | tuple) else [inputs]
            if len(values) != len(self.input_names):
                raise ValueError(
                    f"got {len(values)} input(s); the graph takes {len(self.input_names)}: "
                    f"{listed(self.input_names)}"
                )
        named = dict(zip(self.input_names, values, strict=True))
        # Read as shapes, in numpy: int64 stays exact (INT64_MAX as "to the end").
        fixed = {n: np.asarray(named.pop(n)) for n in self.static_inputs}
        feeds = {n: feed(n, v, self.value_types, self.input_types) for n, v in named.items()}
        layout, buffers, own = pack(feeds, self._packable)
        if device not in self._device_params:  # on the device once, for every run
            _, host_buffers, host_own = self._host_params()
            params = (
                [jnp.asarray(b) for b in host_buffers],
                {n: jnp.asarray(v) for n, v in host_own.items()},
            )
            if device is not None:
                params = jax.device_put(params, device)
            self._device_params[device] = params
        p_buffers, p_own = self._device_params[device]
        # The feeds only (a put of every initializer took most of a run), and not to the
        # device a jitted call puts them on anyway (the put cost a third of a small run).
        if device is not None and not is_default(device):
            buffers, own = jax.device_put((buffers, own), device)
        try:
            constants = self._constants(device)
            arguments = (buffers, own, p_buffers, {**p_own, **constants})
            compiled, out_layout = self._compiled(fixed, layout)
            with paused_gc():  # the first call of a signature traces and lowers
                out_buffers, out_own, checks = compiled(*arguments)
        except jax.errors.JaxRuntimeError as error:
            if "RESOURCE_EXHAUSTED" not in str(error):
                raise
            raise ValueError(
                f"the graph of outputs {listed(list(self.output_names))} does not fit in the "
                f"device's memory ({str(error).splitlines()[0]}); feed smaller inputs, or lower "
                "limits=Limits(tensor_bytes=...) to have the node that grows so large named"
            ) from None
        raise_failed(checks)
        results = cut([np.asarray(b) for b in out_buffers], out_layout[0])
        results.update((name, host_value(value)) for name, value in out_own.items())
        return [
            declared_output(name, results[name], dtype, kind)
            for name, dtype, kind in zip(
                self.output_names, self.output_dtypes, self.output_kinds, strict=True
            )
        ]

    def _host_params(self) -> tuple[Layout, list[np.ndarray], dict[str, np.ndarray]]:
        """The float initializers, checked and packed on the host once (see ``pack``)."""
        if self._packed_params is None:
            checked = {n: host_array(f"initializer '{n}'", v) for n, v in self.params.items()}
            self._packed_params = pack(checked, self._packable)
        return self._packed_params

    def _params_layout(self) -> tuple[Layout, list[jax.ShapeDtypeStruct], dict[str, Any]]:
        """How the initializers are packed, and the shapes of the packed arguments.

        Their values are not checked here (the first call does that, :meth:`_host_params`),
        so that a graph whose initializers JAX cannot hold still prepares.
        """
        if self._params_shapes is None:
            layout, buffers, own = pack(self.params, self._packable)
            self._params_shapes = (
                layout,
                jax.tree.map(abstract, buffers),
                jax.tree.map(abstract, own),
            )
        return self._params_shapes

    @property
    def compilations(self) -> int:
        """How many times the graph has been compiled (once per input signature)."""
        return sum(jitted.cache_size() for jitted, _ in self._compilations.values())

    def _compiled(self, fixed: dict[str, np.ndarray], layout: Layout) -> tuple[Any, list[Layout]]:
        """The jitted graph for a packing of the feeds and values of the inputs read as shapes.

        The second item holds the layout of the packed outputs once it has been traced.
        """
        key = (
            layout,
            tuple((n, v.dtype.str, v.shape, v.tobytes()) for n, v in sorted(fixed.items())),
        )
        if key not in self._compilations:
            p_layout = self._params_layout()[0]
            out_layout: list[Layout] = []

            def run(
                buffers: list[Any], own: dict[str, Any], p_buffers: list[Any], p_own: dict[str, Any]
            ) -> tuple[list[Any], dict[str, Any], RunChecks]:
                env: Env = dict(self.static)
                env.update(self._host_constants)
                env.update(unpack(p_layout, p_buffers))
                env.update(p_own)  # with the constants computed in JAX
                env.update(unpack(layout, buffers))
                env.update(own)
                env.update(fixed)
                with collect_run_checks() as checks:
                    values = self.evaluate(env, differentiable=False, steps=self._run_schedule)
                packed, out_buffers, out_own = outputs_of(values, self.output_names)
                out_layout[:] = [packed]
                return out_buffers, out_own, RunChecks.of(checks)

            self._compilations[key] = (SizedJit(run), out_layout)
        return self._compilations[key]
