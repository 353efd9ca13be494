"""``onnx-optax demo``: a Flax NNX MLP on scikit-learn's digits, one run per optimizer.

Trains the same small MLP (64-64-10) from the same initialization with
onnx_optax's adagrad, adam, momentum and nesterov and with optax's nearest
built-ins, prints one line per epoch while it trains, then a table (test
accuracy, final loss, time a step) and writes a PNG of the loss curves. The
digits data set (1,797 8x8 images) ships with scikit-learn: nothing is
downloaded. Needs the ``examples`` extra.

The command's options are :func:`add_parser`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

import onnx_optax
from onnx_optax._src.extras import require
from onnx_optax._src.write import write_file
from onnx_optax.cli.common import Commands, UsageError, writable_file

BATCH = 64


def optimizers() -> dict[str, Callable[[], optax.GradientTransformation]]:
    """The optimizers the demo compares, ONNX ones first, each with its optax counterpart."""
    return {
        "onnx adagrad": lambda: onnx_optax.adagrad(0.05),
        "onnx adam": lambda: onnx_optax.adam(3e-3),
        "onnx momentum": lambda: onnx_optax.momentum(
            0.05, alpha=0.9, beta=1.0, norm_coefficient=0.0
        ),
        "onnx nesterov": lambda: onnx_optax.nesterov(
            0.05, alpha=0.9, beta=1.0, norm_coefficient=0.0
        ),
        "optax.adagrad": lambda: optax.adagrad(0.05),
        "optax.adam": lambda: optax.adam(3e-3),
        "optax.sgd momentum": lambda: optax.sgd(0.05, momentum=0.9),
        "optax.sgd nesterov": lambda: optax.sgd(0.05, momentum=0.9, nesterov=True),
    }


@dataclasses.dataclass
class Result:
    name: str
    losses: list[float]  # mean training loss of each epoch
    accuracy: float  # on the held-out test set
    ms_per_step: float


def load_digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits, scaled to [0, 1], split 80/20 with ``seed``."""
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    data = sklearn_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    return x_train, y_train, x_test, y_test


def train(
    name: str,
    make_tx: Callable[[], optax.GradientTransformation],
    data: tuple[np.ndarray, ...],
    *,
    epochs: int,
    seed: int,
    report: Callable[[str], None] = lambda line: print(line, flush=True),
) -> Result:
    """Trains the MLP with one optimizer; reports one line per epoch."""
    from flax import nnx

    x_train, y_train, x_test, y_test = data

    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.hidden = nnx.Linear(64, 64, rngs=rngs)
            self.out = nnx.Linear(64, 10, rngs=rngs)

        def __call__(self, x: ArrayLike) -> jax.Array:
            return self.out(nnx.relu(self.hidden(jnp.asarray(x))))

    model = MLP(nnx.Rngs(seed))
    optimizer = nnx.Optimizer(model, make_tx(), wrt=nnx.Param)

    @nnx.jit
    def step(model: MLP, optimizer: nnx.Optimizer, x: ArrayLike, y: ArrayLike) -> jax.Array:
        def loss_fn(model: MLP) -> jax.Array:
            return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    rng = np.random.default_rng(seed)
    steps_per_epoch = len(x_train) // BATCH
    losses: list[float] = []
    step_time = 0.0
    timed_steps = 0
    for epoch in range(epochs):
        order = rng.permutation(len(x_train))
        epoch_losses = []
        for b in range(steps_per_epoch):
            batch = order[b * BATCH : (b + 1) * BATCH]
            start = time.perf_counter()
            loss = step(model, optimizer, x_train[batch], y_train[batch])
            loss.block_until_ready()
            if epoch or b:  # the first step compiles
                step_time += time.perf_counter() - start
                timed_steps += 1
            epoch_losses.append(float(loss))
        losses.append(float(np.mean(epoch_losses)))
        if epoch % max(1, epochs // 5) == 0 or epoch == epochs - 1:
            report(f"  {name:<20} epoch {epoch + 1:>3}/{epochs}  loss {losses[-1]:.4f}")
    accuracy = float(jnp.mean(jnp.argmax(model(x_test), axis=-1) == y_test))
    return Result(name, losses, accuracy, 1e3 * step_time / max(timed_steps, 1))


# Each ONNX optimizer and its optax counterpart, drawn in one panel.
PAIRS = (
    ("onnx adagrad", "optax.adagrad"),
    ("onnx adam", "optax.adam"),
    ("onnx momentum", "optax.sgd momentum"),
    ("onnx nesterov", "optax.sgd nesterov"),
)


def difference(a: list[float], b: list[float]) -> str:
    """The largest relative difference of two loss curves, in words."""
    gap = max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b, strict=True))
    return "identical" if gap == 0 else f"differ by up to {gap:.1%}"


def plot(results: list[Result], path: str) -> None:
    """One panel per ONNX optimizer and its optax counterpart, so that neither hides the other.

    The ONNX curve is a wide pale line, optax's a thin dashed line with markers on top
    of it in the same colour; each panel's title says how far apart they are.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_name = {r.name: r for r in results}
    fig, axes = plt.subplots(2, 2, figsize=(9, 6), dpi=100, sharex=True, sharey=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (ours, theirs), colour in zip(axes.flat, PAIRS, colours, strict=False):
        a, b = by_name[ours].losses, by_name[theirs].losses
        epochs = range(1, len(a) + 1)
        ax.plot(epochs, a, "-", color=colour, lw=5, alpha=0.35, label=ours)
        ax.plot(epochs, b, "--", color=colour, lw=1.2, marker="o", ms=3, label=theirs)
        ax.set_yscale("log")
        ax.set_title(f"{ours} vs {theirs}: {difference(a, b)}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("epoch")
    for ax in axes[:, 0]:
        ax.set_ylabel("mean training loss")
    fig.suptitle("MLP on scikit-learn digits: each ONNX optimizer (wide) and optax's (dashed)")
    fig.tight_layout()
    # The format from the name, as savefig(path) would; none there: matplotlib's default (PNG).
    suffix = pathlib.PurePath(path).suffix.lstrip(".").lower() or None
    try:
        write_file(path, lambda file: fig.savefig(file, format=suffix), what="the plot")
    finally:
        plt.close(fig)


def run_demo(epochs: int, seed: int, output: str | None) -> int:
    """The ``onnx-optax demo`` command; ``output`` is a PNG path in an existing folder."""
    require("onnx-optax demo", "examples", "flax", "sklearn", "matplotlib")
    if epochs < 1:
        print("onnx-optax demo: --epochs must be at least 1", file=sys.stderr)
        return 2
    data = load_digits(seed)
    print(
        f"Training a 64-64-10 MLP on scikit-learn digits ({len(data[0])} train, {len(data[2])} "
        f"test images) for {epochs} epochs, batch {BATCH}, on {jax.devices()[0].platform}:",
        flush=True,
    )
    results: list[Result] = []
    for name, make_tx in optimizers().items():
        results.append(train(name, make_tx, data, epochs=epochs, seed=seed))
    print()
    print(f"{'optimizer':<20} {'test accuracy':>13} {'final loss':>11} {'ms/step':>9}")
    for r in results:
        print(f"{r.name:<20} {r.accuracy:>13.3f} {r.losses[-1]:>11.4f} {r.ms_per_step:>9.3f}")
    if output:
        try:
            plot(results, output)
        except (ValueError, OSError) as error:  # the folder changed since the CLI checked it
            print(f"onnx-optax demo: {error}", file=sys.stderr)
            return 2
        print(f"\nwrote the loss curves to {output}")
    return 0


def run(args: argparse.Namespace) -> int:
    """``onnx-optax demo``: its options checked (and the examples extra), then the demo."""
    if args.epochs < 1:
        raise UsageError("--epochs must be at least 1")
    if args.output:
        writable_file(args.output, "the plot")
    require("onnx-optax demo", "examples", "flax", "sklearn", "matplotlib")
    return run_demo(epochs=args.epochs, seed=args.seed, output=args.output)


def add_parser(commands: Commands) -> None:
    """Adds ``demo`` and its options to ``commands``."""
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
    demo.set_defaults(run=run)
