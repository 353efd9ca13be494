"""The ``onnx-optax`` command line: ``demo``, ``conformance``, ``bench``, ``attach``,
``check`` and ``train``.

Exit status: 0 success (every conformance case passes), 1 a check failed (a
conformance case, a training model's problems), 2 a usage error (a file that
cannot be read, a model the command cannot read or check, data that do not fit
the model, a position or log ``train`` did not write) or a missing optional
dependency, 128 + the signal after an interrupt (130 for Ctrl-C; ``train``
saves first). With no command, ``onnx-optax`` prints its help and exits 2.
Every error is one line on stderr, never a traceback: an exception no check
foresaw is exit 2 too, its line naming its type and where it was raised.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import importlib.util
import inspect
import math
import os
import pathlib
import sys
import tomllib
import traceback
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import onnx_optax
from onnx_optax._src.extras import MissingExtraError, require
from onnx_optax._src.host_memory import reuse_host_memory
from onnx_optax._src.registry import OPTIMIZERS
from onnx_optax._src.write import check_destination

if TYPE_CHECKING:
    import onnx

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 128 + 2  # SIGINT, as a shell reports it
# The most characters of an error message (a stranger's names can be megabytes long).
MESSAGE_CHARACTERS = 2000
# Set (to anything but ""), an exception no check foresaw leaves main with its traceback.
TRACEBACK_VARIABLE = "ONNX_OPTAX_TRACEBACK"

# The key of a model's metadata_props where train keeps its position (see _src/trainer.py).
POSITION_KEY = "onnx_optax.train"

# The benchmark harness lives in the repository, not in the package.
BENCHMARK = pathlib.Path("benchmarks") / "optimizer_step.py"


class UsageError(Exception):
    """A command's arguments cannot work (exit status 2); the message says why."""


def _writable_file(path: str, what: str) -> None:
    """Raises :class:`UsageError` unless ``path`` can be written: checked before the work.

    The write itself checks again (the file system may change meanwhile).
    """
    try:
        check_destination(path, what)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _file_key(path: str) -> str:
    """The file ``path`` names: its folder resolved, its own name kept (a link there is
    replaced by the write, never followed)."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(os.path.realpath(folder), name)


def drop_position(model: onnx.ModelProto) -> bool:
    """Removes train's position from ``model``'s metadata_props; whether it held one.

    A model that ``attach`` makes, or an inference model, has no run of ``train`` to resume.
    """
    kept = [(p.key, p.value) for p in model.metadata_props if p.key != POSITION_KEY]
    if len(kept) == len(model.metadata_props):
        return False
    del model.metadata_props[:]
    for key, value in kept:
        model.metadata_props.add(key=key, value=value)
    return True


def _write_model(model: onnx.ModelProto, path: str) -> None:
    """Writes ``model`` through the package's one writer; its refusals are usage errors."""
    from onnx_optax.training._export import save_model

    try:
        save_model(model, path, None, {})
    except (ValueError, OSError) as error:
        raise UsageError(str(error)) from None


def _demo(args: argparse.Namespace) -> int:
    if args.epochs < 1:
        raise UsageError("--epochs must be at least 1")
    if args.output:
        _writable_file(args.output, "the plot")
    require("onnx-optax demo", "examples", "flax", "sklearn", "matplotlib")
    from onnx_optax._src.demo import run_demo

    return run_demo(epochs=args.epochs, seed=args.seed, output=args.output)


def _conformance(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        raise UsageError("--rounds must be at least 1")
    require("onnx-optax conformance", "onnx", "onnx", "onnx.reference")
    from onnx_optax._src.conformance import run_conformance

    return run_conformance(seed=args.seed, rounds=args.rounds, long=args.long)


def find_benchmark() -> pathlib.Path | None:
    """``benchmarks/optimizer_step.py`` of the checkout the package runs from, or of the cwd
    when the cwd is a clone of onnx_optax (its ``pyproject.toml`` names the project): bench
    runs that file, so it never runs one that a folder of someone else's holds."""
    source_root = pathlib.Path(onnx_optax.__file__).resolve().parent.parent
    if (source_root / BENCHMARK).is_file():
        return source_root / BENCHMARK
    cwd = pathlib.Path.cwd()
    if (cwd / BENCHMARK).is_file() and _is_clone(cwd):
        return cwd / BENCHMARK
    return None


def _is_clone(root: pathlib.Path) -> bool:
    """Whether ``root/pyproject.toml`` (read up to 1 MiB) names the project onnx-optax."""
    try:
        with open(root / "pyproject.toml", "rb") as file:
            text = file.read(2**20 + 1)
        if len(text) > 2**20:
            return False
        project = tomllib.loads(text.decode("utf-8")).get("project")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return False
    return isinstance(project, dict) and project.get("name") == "onnx-optax"


def _load(path: pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("onnx_optax_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _bench(args: argparse.Namespace) -> int:
    path = find_benchmark()
    if path is None:
        raise UsageError(
            f"the benchmark harness ({BENCHMARK}) is not installed with the package; run "
            "onnx-optax bench from a clone of the repository (git clone, then pip install -e .)"
        )
    for target in (args.markdown, args.plot):
        if target:
            _writable_file(target, "the output")
    if args.plot:
        require("onnx-optax bench --plot", "examples", "matplotlib")
    result: int = _load(path).run_bench(
        mode="smoke" if args.smoke else "quick" if args.quick else "full",
        markdown=args.markdown,
        plot=args.plot,
        slow=not args.no_slow,
    )
    return result


def _training() -> ModuleType:
    (training,) = require("onnx-optax training", "onnx", "onnx_optax.training")
    return training


def _read_model(training: ModuleType, path: str) -> onnx.ModelProto:
    if not pathlib.Path(path).is_file():
        raise UsageError(f"cannot read the model {path!r}: no such file")
    try:
        model: onnx.ModelProto = training.load(path)
        return model
    except Exception as error:  # a stranger's file: any parse failure is a usage error
        raise UsageError(f"cannot read the model {path!r}: {error}") from None


# ----------------------------------------------------------------------------- attach

# Momentum's operator has no defaults (ONNX requires its attributes): the CLI's own,
# PyTorch's SGD with momentum 0.9.
MOMENTUM_DEFAULTS = {"alpha": 0.9, "beta": 1.0, "norm_coefficient": 0.0}
# Each optimizer's hyperparameters and their defaults in the CLI: its operator's attributes
# (those its mode does not fix), with the operator's defaults, else the CLI's (an attribute
# with neither is a KeyError here, at import, not a None default).
HYPERPARAMETERS: dict[str, dict[str, float]] = {
    name: {
        field: {**MOMENTUM_DEFAULTS, **operator.attributes._field_defaults}[field]
        for field in operator.attributes._fields
        if field not in fixed
    }
    for name, (operator, fixed) in OPTIMIZERS.items()
}
HYPERPARAMETER_HELP = {
    "alpha": "Adam: the first moment's decay; Momentum, Nesterov: the momentum's decay",
    "beta": "Adam: the second moment's decay; Momentum, Nesterov: the gradient's factor",
    "epsilon": "Adagrad, Adam: added to the square root of H",
    "decay_factor": "Adagrad: R / (1 + T * decay_factor)",
    "norm_coefficient": "coupled L2: norm_coefficient * X is added to the gradient (as "
    "torch.optim's weight_decay in Adam, Adagrad and SGD)",
    "norm_coefficient_post": "Adam: X becomes (1 - c) X after the step",
}
# --weight-decay: Adam only, written as the AdamW mapping of docs/onnxruntime-training.md.
WEIGHT_DECAY = "weight_decay"
# The schedules of training.schedules by their short names; the argument that is "the
# learning rate" (taken from --learning-rate when the spec leaves it out); other defaults.
SCHEDULES = {
    "constant": "constant_schedule",
    "linear": "linear_schedule",
    "exponential_decay": "exponential_decay",
    "cosine_decay": "cosine_decay_schedule",
    "warmup_cosine_decay": "warmup_cosine_decay_schedule",
}
SCHEDULE_RATE = {
    "constant_schedule": "value",
    "linear_schedule": "init_value",
    "exponential_decay": "init_value",
    "cosine_decay_schedule": "init_value",
    "warmup_cosine_decay_schedule": "peak_value",
}
SCHEDULE_DEFAULTS: dict[str, dict[str, float]] = {
    "warmup_cosine_decay_schedule": {"init_value": 0.0}
}
DEFAULT_LEARNING_RATE = 1e-3
GLOB = frozenset("*?[")


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _literal(node: ast.expr, spec: str) -> object:
    """A number, True, False or None written in ``spec``: read, never evaluated."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # {[1]}: TypeError
        value = None
        bad = True
    else:
        bad = not (value is None or isinstance(value, bool | int | float))
    if bad:
        raise UsageError(
            f"--schedule {spec!r}: {ast.unparse(node)!r} is not a number, True, False or None"
        )
    return value


def _schedule(spec: str, learning_rate: float | None) -> tuple[object, str, float]:
    """``--schedule NAME(ARG=VALUE, ...)`` as a schedule of training.schedules, and its rate.

    The spec is parsed as a Python call of literals (``ast``, nothing is
    evaluated); the argument that is the learning rate (``value``,
    ``init_value`` or ``peak_value``) defaults to ``learning_rate``. Returns the
    schedule, that argument's name and its value (the rate --weight-decay multiplies).
    """
    from onnx_optax.training import schedules

    names = ", ".join(SCHEDULES)
    try:
        call = ast.parse(spec.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):  # ValueError: a NUL byte
        call = None
    if isinstance(call, ast.Name):
        call = ast.Call(func=call, args=[], keywords=[])
    if (
        not isinstance(call, ast.Call)
        or not isinstance(call.func, ast.Name)
        or any(isinstance(a, ast.Starred) for a in call.args)
        or any(k.arg is None for k in call.keywords)
    ):
        raise UsageError(
            f"--schedule takes NAME or NAME(ARGUMENT=VALUE, ...), such as "
            f"'warmup_cosine_decay(warmup_steps=100, decay_steps=10000)'; got {spec!r}. "
            f"The schedules: {names}"
        )
    name = SCHEDULES.get(call.func.id, call.func.id)
    if name not in SCHEDULE_RATE:
        raise UsageError(f"--schedule: unknown schedule {call.func.id!r}; the schedules: {names}")
    function = getattr(schedules, name)
    signature = inspect.signature(function)
    rate = SCHEDULE_RATE[name]
    defaults = {rate: "LR", **SCHEDULE_DEFAULTS.get(name, {})}
    shown = (
        f"{call.func.id}("
        + ", ".join(
            f"{p.name}={defaults.get(p.name, p.default)}"
            if p.name in defaults or p.default is not p.empty
            else p.name
            for p in signature.parameters.values()
        )
        + ") with LR from --learning-rate"
    )
    args = [_literal(a, spec) for a in call.args]
    kwargs = {str(k.arg): _literal(k.value, spec) for k in call.keywords}
    try:
        bound = signature.bind_partial(*args, **kwargs).arguments
    except TypeError as error:
        raise UsageError(f"--schedule {spec!r}: {error}; it takes {shown}") from None
    if rate in bound and learning_rate is not None:
        raise UsageError(
            f"--schedule {spec!r} gives {rate} and --learning-rate gives it too; give one"
        )
    if rate not in bound:
        bound[rate] = DEFAULT_LEARNING_RATE if learning_rate is None else learning_rate
    for key, value in SCHEDULE_DEFAULTS.get(name, {}).items():
        bound.setdefault(key, value)
    for key, value in bound.items():  # 1e4 steps is a count of steps
        parameter = signature.parameters[key]
        if parameter.annotation == "int" and isinstance(value, float) and value.is_integer():
            bound[key] = int(value)
    missing = [
        p for p in signature.parameters.values() if p.name not in bound and p.default is p.empty
    ]
    if missing:
        raise UsageError(
            f"--schedule {spec!r}: missing {', '.join(p.name for p in missing)}; it takes {shown}"
        )
    try:
        schedule = function(**bound)
    except (TypeError, ValueError) as error:
        raise UsageError(f"--schedule: {error}") from None
    return schedule, rate, float(bound[rate])


def _hyperparameters(args: argparse.Namespace, rate: float, scheduled: str) -> dict[str, float]:
    """The optimizer's keyword arguments: its defaults, the options given, --weight-decay.

    ``rate`` is the learning rate --weight-decay multiplies; ``scheduled`` the
    schedule's argument it comes from ("" without a schedule).
    """
    applicable = HYPERPARAMETERS[args.optimizer]
    given = {
        name: getattr(args, name)
        for name in (*HYPERPARAMETER_HELP, WEIGHT_DECAY)
        if getattr(args, name) is not None
    }
    allowed = set(applicable) | ({WEIGHT_DECAY} if args.optimizer == "adam" else set())
    wrong = [name for name in given if name not in allowed]
    if wrong:
        options = ", ".join(_option(n) for n in [*applicable, *(allowed - set(applicable))])
        hint = (
            "; its coupled L2 decay (torch.optim's weight_decay) is --norm-coefficient"
            if WEIGHT_DECAY in wrong
            else ""
        )
        raise UsageError(
            f"{', '.join(_option(n) for n in wrong)} "
            f"{'does' if len(wrong) == 1 else 'do'} not apply to {args.optimizer} "
            f"(its options: {options}){hint}"
        )
    kwargs = {**applicable, **given}
    decay = kwargs.pop(WEIGHT_DECAY, None)
    if decay is not None:
        if "norm_coefficient_post" in given:
            raise UsageError(
                "--weight-decay sets norm_coefficient_post (learning rate * weight decay); "
                "give it or --norm-coefficient-post, not both"
            )
        if not math.isfinite(decay) or decay < 0:
            raise UsageError(f"--weight-decay must be a finite number >= 0, got {decay}")
        kwargs["norm_coefficient_post"] = rate * decay
        if scheduled:
            print(
                f"note: --weight-decay {decay}: norm_coefficient_post = {rate} * {decay} = "
                f"{rate * decay:g} (the schedule's {scheduled} as the learning rate) stays "
                "constant while the schedule changes R; PyTorch's AdamW decay would follow it",
                file=sys.stderr,
            )
    return kwargs


def _patterns(
    option: str, patterns: list[str] | None, plan: object, lift_constants: bool
) -> list[str] | None:
    """``--trainable``/``--frozen`` patterns as the tensor names they match (fnmatch).

    A name without ``*?[`` (or that is exactly a tensor's name) names that
    tensor; a glob matches among the plan's tensors, and for --trainable
    among its weights only (a constant or a hyperparameter trains when named
    exactly). A pattern that matches nothing is a usage error.
    """
    if patterns is None:
        return None
    tensors = [
        t
        for t in plan.tensors  # type: ignore[attr-defined]
        if lift_constants or t.source == "initializer"
    ]
    names: dict[str, None] = {}
    for pattern in patterns:
        exact = [t for t in tensors if t.name == pattern]
        if exact or not GLOB & set(pattern):
            if not exact:
                raise UsageError(
                    f"{option} {pattern!r} names no tensor of the model (see --list for them)"
                )
            names[pattern] = None
            continue
        matched = [t for t in tensors if fnmatch.fnmatchcase(t.name, pattern)]
        if option == "--trainable":
            weights = [t for t in matched if t.kind == "weight"]
            if matched and not weights:
                found = ", ".join(f"'{t.name}' ({t.kind})" for t in matched[:5])
                raise UsageError(
                    f"--trainable {pattern!r} matches no weight, only {found}"
                    + (" ..." if len(matched) > 5 else "")
                    + "; name a tensor exactly to train it anyway"
                )
            matched = weights
        if not matched:
            raise UsageError(
                f"{option} {pattern!r} matches no tensor of the model (see --list for them)"
            )
        names.update(dict.fromkeys(t.name for t in matched))
    return list(names)


def _attach(args: argparse.Namespace) -> int:
    training = _training()
    from onnx_optax.training._plan import loss_output

    if args.output is None and not args.list:
        raise UsageError("attach needs -o/--output (or --list to print the plan alone)")
    if args.output is not None:
        _writable_file(args.output, "the model")
    if args.learning_rate is not None and (
        not math.isfinite(args.learning_rate) or args.learning_rate <= 0
    ):
        raise UsageError(f"--learning-rate must be a finite number > 0, got {args.learning_rate}")
    if args.trainable is not None and args.frozen is not None:
        raise UsageError("give --trainable (exactly these) or --frozen (every weight but these)")
    model = _read_model(training, args.model)
    lift = not args.keep_constants
    try:
        output = loss_output(model, args.output_name, "--output-name")
        default_plan = training.plan(model, output=output, lift_constants=lift)
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None
    # What trains: the same arguments for the plan and for attach.
    chosen = {
        "output": output,
        "trainable": _patterns("--trainable", args.trainable, default_plan, lift),
        "frozen": _patterns("--frozen", args.frozen, default_plan, lift),
        "lift_constants": lift,
    }
    if args.list:
        try:
            plan = training.plan(model, **chosen)
        except (TypeError, ValueError) as error:
            raise UsageError(str(error)) from None
        print(plan)
        if args.output is None:
            return EXIT_OK
    learning_rate: object
    if args.schedule is not None:
        learning_rate, scheduled, rate = _schedule(args.schedule, args.learning_rate)
    else:
        learning_rate = rate = (
            DEFAULT_LEARNING_RATE if args.learning_rate is None else args.learning_rate
        )
        scheduled = ""
    kwargs = _hyperparameters(args, rate, scheduled)
    factory = getattr(onnx_optax, args.optimizer)
    try:
        optimizer = factory(learning_rate, **kwargs)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", UserWarning)
            attached = training.attach(
                model,
                loss=args.loss,
                target=args.target,
                optimizer=optimizer,
                clip_global_norm=args.clip_global_norm,
                class_axis=args.class_axis,
                dropout=args.dropout,
                master_dtype=args.master_dtype,
                compute_dtype=args.compute_dtype,
                loss_scale=args.loss_scale,
                loss_scale_period=args.loss_scale_period,
                **chosen,
            )
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None
    for warning in said:
        print(f"note: {warning.message}", file=sys.stderr)
    if drop_position(attached):
        print(
            f"note: left out the position of an earlier train (metadata '{POSITION_KEY}'): "
            "the attached model's training starts anew",
            file=sys.stderr,
        )
    _write_model(attached, args.output)
    target = attached.training_info[0].algorithm.input[0].name
    print(
        f"wrote {args.output} (its step reads the targets from input '{target}')", file=sys.stderr
    )
    return EXIT_OK


def _check(args: argparse.Namespace) -> int:
    training = _training()
    model = _read_model(training, args.model)
    try:
        problems = training.check(model)
    except (TypeError, ValueError, NotImplementedError) as error:
        raise UsageError(f"{args.model}: {error}") from None
    from onnx_optax._src.trainer import _saved_position

    blocking: list[object] = [p for p in problems if p.blocking]
    for problem in problems:  # one problem a line, whatever names the model holds
        print(one_line(str(problem) if problem.blocking else f"warning: {problem}"))
    try:  # where a train stopped, as train reads it
        _saved_position(model, args.model)
    except UsageError as error:
        print(one_line(str(error)))
        blocking.append(error)
    if blocking:
        print(f"{args.model}: {len(blocking)} problem(s)", file=sys.stderr)
        return EXIT_FAILED
    warned = len(problems) - len(blocking)
    print(f"{args.model}: ok" + (f" ({warned} warning(s))" if warned else ""))
    return EXIT_OK


def _batch_axes(specs: list[str] | None) -> dict[str, int]:
    """``--batch-axis NAME=AXIS`` options as a mapping from name to axis."""
    axes: dict[str, int] = {}
    for spec in specs or []:
        name, _, axis = spec.rpartition("=")
        try:
            number = int(axis)
        except ValueError:
            number = None
        if not name or number is None:
            raise UsageError(f"--batch-axis takes NAME=AXIS (such as target=1), got {spec!r}")
        if name in axes:
            raise UsageError(f"--batch-axis names '{name}' twice")
        axes[name] = number
    return axes


def _train(args: argparse.Namespace) -> int:
    for option, value, least in (
        ("--steps", args.steps, 1),
        ("--epochs", args.epochs, 1),
        ("--batch-size", args.batch_size, 1),
        ("--log-every", args.log_every, 1),
        ("--val-every", args.val_every, 1),
        ("--save-every", args.save_every, 1),
        ("--seed", args.seed, 0),
    ):
        if value is not None and value < least:
            raise UsageError(f"{option} must be at least {least}, got {value}")
    if args.val_every is not None and not args.val_data:
        raise UsageError("--val-every needs --val-data")
    axes = _batch_axes(args.batch_axis)
    _writable_file(args.output, "the model")
    written = {_file_key(args.output): "-o"}
    for path, what, option in (
        (args.inference, "inference model", "--inference"),
        (args.log, "log", "--log"),
        (args.plot, "plot", "--plot"),
    ):
        if path:
            _writable_file(path, f"the {what}")
            if _file_key(path) in written:  # one write would replace the other's file
                raise UsageError(
                    f"{option} {path!r} is the file {written[_file_key(path)]} names; give "
                    "each output its own file"
                )
            written[_file_key(path)] = option
    for path, option in (
        (args.model, "the model"),
        (args.data, "--data"),
        (args.val_data, "--val-data"),
    ):
        writer = written.get(_file_key(path)) if path else None
        if writer and not (writer == "-o" and option == "the model"):  # -o may replace the model
            raise UsageError(
                f"{writer} names the file {option} reads ({path!r}); give each output its own file"
            )
    if args.plot:
        require("onnx-optax train --plot", "examples", "matplotlib")
    from onnx_optax._src.trainer import run_train

    return run_train(args, axes)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-optax",
        description="ONNX training operators (Adagrad, Adam, Momentum) on JAX/XLA.",
        epilog="exit status: 0 success, 1 a check failed (conformance), 2 a usage error or a "
        "missing optional dependency, 130 interrupted (train saves first)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {onnx_optax.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="train a Flax MLP on scikit-learn digits with each ONNX optimizer",
        description="Train the same 64-64-10 Flax NNX MLP on scikit-learn's bundled digits "
        "(nothing is downloaded) with onnx_optax's adagrad, adam, momentum and nesterov and "
        "with optax's nearest built-ins; print the loss while training, then a table of test "
        "accuracy, final loss and time a step, and write a PNG of the loss curves. Needs the "
        "examples extra.",
    )
    demo.add_argument("--epochs", type=int, default=30, help="training epochs (default: 30)")
    demo.add_argument(
        "--seed", type=int, default=0, help="seed of the data split, init and batches (default: 0)"
    )
    demo.add_argument(
        "--output",
        default="onnx-optax-demo.png",
        help="PNG file for the loss curves (default: onnx-optax-demo.png); '' to skip; its "
        "folder must exist",
    )
    demo.set_defaults(run=_demo)

    conformance = commands.add_parser(
        "conformance",
        help="check onnx_optax against the ONNX node cases and onnx.reference on this device",
        description="Run the seven ONNX backend node cases and a randomized differential test "
        "against onnx.reference (T > 0, decay and both norm coefficients non-zero, float32 and "
        "float64, several tensors) on the device JAX sees; print a table of errors and exit 1 if "
        "any case fails. Needs the onnx extra.",
    )
    conformance.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    conformance.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="random cases per operator and dtype (default: 3)",
    )
    conformance.add_argument(
        "--long",
        action="store_true",
        help="50 random cases per operator and dtype, attributes over their whole valid range "
        "and T up to 2**31-1 (a few minutes); for a new device or JAX version",
    )
    conformance.set_defaults(run=_conformance)

    bench = commands.add_parser(
        "bench",
        help="time optimizer steps against optax, torch, onnx.reference and the memory roofline "
        "(from a clone of the repository)",
        description="Run the benchmark harness benchmarks/optimizer_step.py of a repository "
        "checkout: time one step of adagrad, adam, momentum and nesterov on large tensors, a "
        "model-shaped pytree, many small leaves and bfloat16 parameters: onnx_optax's "
        "transformation and op, optax's nearest built-in, torch.optim with foreach (if "
        "installed) and the onnx.reference formulas (if onnx is installed), against a jitted "
        "triad that measures the memory bandwidth. Prints a table of medians and ratios to "
        "optax's time. Not available from an installed wheel: run it from a clone.",
    )
    size = bench.add_mutually_exclusive_group()
    size.add_argument(
        "--quick",
        action="store_true",
        help="small, in-cache sizes and few repeats (about a minute): checks that everything "
        "runs, measures little",
    )
    size.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, one round (seconds): a test of the harness",
    )
    bench.add_argument("--markdown", metavar="PATH", help="also write the table as markdown")
    bench.add_argument(
        "--plot", metavar="PATH", help="also time Adam from 1e3 to 6.4e7 elements; write a PNG"
    )
    bench.add_argument("--no-slow", action="store_true", help="skip torch.optim and onnx.reference")
    bench.set_defaults(run=_bench)

    attach = commands.add_parser(
        "attach",
        help="make an inference ONNX model trainable: add a loss and an optimizer (training_info)",
        description="Add training_info to an inference model: the loss of one graph output "
        "against a new target input, its Gradient, an optimizer node, T + 1 and the bindings. "
        "The inference graph is left as it is; R (a number or a schedule of T) is multiplied "
        "by a stored scale of 1 that Session.set_learning_rate changes while training. Options "
        "of another optimizer than --optimizer's are refused. Needs the onnx extra.",
    )
    attach.add_argument("model", help="the inference model (.onnx)")
    attach.add_argument("-o", "--output", help="the training model to write")
    attach.add_argument(
        "--list",
        action="store_true",
        help="print the plan: every tensor the model stores, whether it trains and why "
        "(with no -o, print it and write nothing)",
    )
    attach.add_argument(
        "--loss",
        default="softmax_cross_entropy",
        help="softmax_cross_entropy (logits), log_loss (probabilities), nll "
        "(log-probabilities): int64 class targets; mse, l1, bce_with_logits (logits): targets "
        "shaped like the output (default: softmax_cross_entropy)",
    )
    attach.add_argument(
        "--optimizer",
        default="adam",
        choices=list(HYPERPARAMETERS),
        help="the ONNX optimizer node (default: adam)",
    )
    attach.add_argument(
        "--learning-rate",
        type=float,
        metavar="LR",
        help=f"R (default: {DEFAULT_LEARNING_RATE:g}); with --schedule, the schedule's value, "
        "init_value or peak_value when the schedule does not give it",
    )
    attach.add_argument(
        "--schedule",
        metavar="SPEC",
        help="R from T as a schedule of onnx_optax.training.schedules, written into the model "
        "as ONNX ops: NAME or NAME(ARGUMENT=VALUE, ...) with optax's arguments, NAME one of "
        "constant(value), linear(init_value, end_value, transition_steps, transition_begin=0), "
        "exponential_decay(init_value, transition_steps, decay_rate, transition_begin=0, "
        "staircase=False, end_value=None), cosine_decay(init_value, decay_steps, alpha=0.0, "
        "exponent=1.0), warmup_cosine_decay(init_value=0.0, peak_value, warmup_steps, "
        "decay_steps, end_value=0.0, exponent=1.0); value, init_value (peak_value for "
        "warmup_cosine_decay) default to --learning-rate. Example: "
        "--schedule 'warmup_cosine_decay(warmup_steps=100, decay_steps=10000)' "
        "--learning-rate 1e-3 (default: none, R is --learning-rate)",
    )
    for name, text in HYPERPARAMETER_HELP.items():
        defaults: dict[float, list[str]] = {}
        for optimizer, values in HYPERPARAMETERS.items():
            if name in values:
                defaults.setdefault(values[name], []).append(optimizer)
        shown = "; ".join(f"{', '.join(o)} {value:g}" for value, o in defaults.items())
        if len(defaults) == 1:
            shown = f"{next(iter(defaults)):g}"
        attach.add_argument(
            _option(name),
            type=float,
            metavar="VALUE",
            help=f"{text} (default: {shown})",
        )
    attach.add_argument(
        "--weight-decay",
        type=float,
        metavar="WD",
        help="Adam: AdamW's decoupled weight decay, written as norm_coefficient_post = "
        "LR * WD, which differs from PyTorch's AdamW by the factor (1 - LR*WD) on the step "
        "(docs/onnxruntime-training.md, 'Adam versus AdamW'); with a schedule LR is the "
        "schedule's value, init_value or peak_value and the decay stays constant "
        "(default: 0)",
    )
    attach.add_argument(
        "--target", help="the new targets input (default: target, or a free name like it)"
    )
    attach.add_argument(
        "--output-name",
        help="the graph output the loss reads (required when the model has several)",
    )
    attach.add_argument(
        "--trainable",
        action="append",
        metavar="PATTERN",
        help="the tensors to train: a name, or an fnmatch pattern ('dense_2/*') matched "
        "against the plan's weights (repeat; a pattern matching nothing is an error; a "
        "constant trains only when named exactly; default: every weight the loss's output "
        "depends on; see --list)",
    )
    attach.add_argument(
        "--frozen",
        action="append",
        metavar="PATTERN",
        help="weights not to train: a name or an fnmatch pattern matched against the plan's "
        "tensors (repeat; every other weight trains; instead of --trainable)",
    )
    attach.add_argument(
        "--clip",
        "--clip-global-norm",
        dest="clip_global_norm",
        type=float,
        metavar="C",
        help="clip the gradients to global norm C, as optax.clip_by_global_norm (default: none)",
    )
    attach.add_argument(
        "--class-axis",
        type=int,
        metavar="AXIS",
        help="the output axis holding the classes, for class losses (default: 1; 2 or -1 for "
        "a time-major [T, N, C] output)",
    )
    attach.add_argument(
        "--dropout",
        action="store_true",
        help="train with the model's Dropout nodes dropping (their training_mode switched "
        "on in the step only; inference stays as exported; masks seeded by train's --seed)",
    )
    attach.add_argument(
        "--master-dtype",
        choices=["float32"],
        help="a float16/bfloat16 model trains float32 master weights and state",
    )
    attach.add_argument(
        "--compute-dtype",
        choices=["bfloat16"],
        help="a float32 model computes in bfloat16 on float32 master weights",
    )
    attach.add_argument(
        "--loss-scale",
        type=float,
        metavar="S",
        help="dynamic loss scaling from S (for float16): a step with a non-finite gradient "
        "is skipped and halves S (default: none)",
    )
    attach.add_argument(
        "--loss-scale-period",
        type=int,
        default=2000,
        metavar="N",
        help="good steps in a row after which S doubles (default: 2000)",
    )
    attach.add_argument(
        "--keep-constants",
        action="store_true",
        help="leave float Constant nodes as they are (by default those in weight positions "
        "become initializers and train)",
    )
    attach.set_defaults(run=_attach)

    check = commands.add_parser(
        "check",
        help="check a training model's training_info (exit 1 and the list of problems)",
        description="Check what the ONNX checker does not: bindings, Gradient xs and y, "
        "optimizer state, T + 1, shapes. Exit 0 if sound, 1 with one problem a line. Lines "
        "starting 'warning:' (a constant or a weight the loss does not reach, trained) do not "
        "fail the check.",
    )
    check.add_argument("model", help="the model (.onnx)")
    check.set_defaults(run=_check)

    train = commands.add_parser(
        "train",
        help="train a model from its own training_info on arrays of an .npz file",
        description="Run the model's training_info on batches of the arrays in --data (named "
        "as the inputs a step reads, one row per example along each one's batch axis) for "
        "--steps steps or --epochs epochs, show the progress on stderr and write the trained "
        "model. The model records where the run stands (epoch, row, seed, steps), so a "
        "train on it continues the same sequence of batches: after an interrupt (SIGINT or "
        "SIGTERM saves, then exits 128 + the signal: 130 for Ctrl-C), the same command on "
        "the saved model finishes the run exactly as if it had not stopped.",
    )
    train.add_argument("model", help="the training model (.onnx)")
    train.add_argument("--data", required=True, help=".npz file of arrays named as the inputs")
    length = train.add_mutually_exclusive_group(required=True)
    length.add_argument("--steps", type=int, help="steps of the run")
    length.add_argument(
        "--epochs", type=int, help="passes over the data (the batches of an epoch, times N)"
    )
    train.add_argument("--batch-size", type=int, default=32, help="rows a step (default: 32)")
    train.add_argument(
        "--shuffle",
        action="store_true",
        help="shuffle the rows of each epoch, in an order that depends on --seed and the "
        "epoch alone (default: in order)",
    )
    train.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the shuffling and of training-mode Dropout's masks (default: 0)",
    )
    train.add_argument(
        "--drop-last",
        action="store_true",
        help="leave out each epoch's last batch when it is smaller than --batch-size (one "
        "shape, one compilation)",
    )
    train.add_argument(
        "--batch-axis",
        action="append",
        metavar="NAME=AXIS",
        help="the batch axis of input NAME (repeat; default 0; target=1 for a time-major "
        "[T, N] target)",
    )
    train.add_argument(
        "--val-data", metavar="FILE", help=".npz file of validation arrays, named as --data's"
    )
    train.add_argument(
        "--val-every",
        type=int,
        metavar="K",
        help="validation loss (and accuracy, for class targets) every K steps and at the end "
        "(default: every epoch)",
    )
    train.add_argument(
        "--log-every",
        type=int,
        default=10,
        metavar="K",
        help="a line of progress (without a terminal) and a row of the log every K steps "
        "(default: 10)",
    )
    train.add_argument(
        "--log",
        metavar="FILE",
        help="the log: CSV, or JSON lines if FILE ends in .jsonl (step, epoch, loss, "
        "validation, learning rate, seconds)",
    )
    train.add_argument(
        "--plot",
        metavar="FILE.png",
        help="the training and validation loss curves (needs the examples extra)",
    )
    train.add_argument(
        "--save-every",
        type=int,
        metavar="K",
        help="also write the model every K steps (default: at the end and on SIGINT/SIGTERM)",
    )
    train.add_argument(
        "--quiet", action="store_true", help="no progress bar or progress lines on stderr"
    )
    train.add_argument(
        "-o",
        "--output",
        required=True,
        help="the trained model to write (each save replaces it whole)",
    )
    train.add_argument(
        "--inference",
        metavar="PATH",
        help="also write the inference model: the trained weights, no training_info or state",
    )
    train.set_defaults(run=_train)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``onnx-optax`` command: ``demo``, ``conformance``, ``bench``,
    ``attach``, ``check``, ``train``.

    Returns the process exit status: 0 success, 1 a check failed, 2 a usage error
    or a missing optional dependency (the message says which extra to install),
    or any other exception of the command (one line, never a traceback), 130
    after Ctrl-C. ``onnx-optax COMMAND --help`` explains each command's options.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    reuse_host_memory()  # a command is a process of its own: see docs/performance.md
    try:
        result: int = args.run(args)
    except (UsageError, MissingExtraError) as error:
        print(f"onnx-optax {args.command}: {one_line(str(error))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # before a command could save anything: no traceback
        print(f"onnx-optax {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (``| head``): no traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except Exception as error:  # what no check foresaw (a bug): still one line, exit 2
        if os.environ.get(TRACEBACK_VARIABLE):  # for a bug report, and for fuzzers
            raise
        print(f"onnx-optax {args.command}: {_unforeseen(error)}", file=sys.stderr)
        return EXIT_USAGE
    return result


def one_line(text: str, limit: int = MESSAGE_CHARACTERS) -> str:
    """``text`` as one line of at most about ``limit`` characters: control characters
    (a newline in a stranger's tensor name) escaped, the middle of a long text left out."""
    if len(text) > limit:
        text = (
            f"{text[: limit // 2]} ... [{len(text) - limit} characters] ... {text[-limit // 2 :]}"
        )
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _unforeseen(error: Exception) -> str:
    """One line for an exception no check turned into a usage error: its type, the line of
    onnx_optax that raised it, its message (for a bug report), never a traceback."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if f"{os.sep}onnx_optax{os.sep}" in f.filename] or frames[-1:]
    where = f" at {os.path.basename(ours[-1].filename)}:{ours[-1].lineno}" if ours else ""
    message = one_line(str(error), MESSAGE_CHARACTERS // 2)
    return (
        f"unexpected {type(error).__name__}{where}{': ' if message else ''}{message} (please "
        f"report it; {TRACEBACK_VARIABLE}=1 shows its traceback)"
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
