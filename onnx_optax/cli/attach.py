"""``onnx-optax attach``: its options (an optimizer's hyperparameters, a schedule, what
trains) and making an inference model trainable with them."""

from __future__ import annotations

import argparse
import ast
import fnmatch
import inspect
import math
import sys
import warnings

import onnx_optax
from onnx_optax._src.registry import OPTIMIZERS
from onnx_optax.cli.common import (
    EXIT_OK,
    POSITION_KEY,
    Commands,
    UsageError,
    drop_position,
    read_model,
    training_module,
    writable_file,
    write_model,
)

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


def run(args: argparse.Namespace) -> int:
    """``onnx-optax attach``: the plan (``--list``), then the training model written to -o."""
    training = training_module()
    from onnx_optax.training._plan import loss_output

    if args.output is None and not args.list:
        raise UsageError("attach needs -o/--output (or --list to print the plan alone)")
    if args.output is not None:
        writable_file(args.output, "the model")
    if args.learning_rate is not None and (
        not math.isfinite(args.learning_rate) or args.learning_rate <= 0
    ):
        raise UsageError(f"--learning-rate must be a finite number > 0, got {args.learning_rate}")
    if args.trainable is not None and args.frozen is not None:
        raise UsageError("give --trainable (exactly these) or --frozen (every weight but these)")
    model = read_model(training, args.model)
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
    write_model(attached, args.output)
    target = attached.training_info[0].algorithm.input[0].name
    print(
        f"wrote {args.output} (its step reads the targets from input '{target}')", file=sys.stderr
    )
    return EXIT_OK


def _optimizer_options(attach: argparse.ArgumentParser) -> None:
    """The loss, the optimizer, its learning rate or schedule and hyperparameters."""
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


def _training_options(attach: argparse.ArgumentParser) -> None:
    """The targets, the output the loss reads, what trains and how."""
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


def _precision_options(attach: argparse.ArgumentParser) -> None:
    """Master weights, compute dtype, loss scaling, constants kept."""
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


def add_parser(commands: Commands) -> None:
    """Adds ``attach`` and its options to ``commands``."""
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
    _optimizer_options(attach)
    _training_options(attach)
    _precision_options(attach)
    attach.set_defaults(run=run)
