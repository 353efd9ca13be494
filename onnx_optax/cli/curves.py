"""The loss curves of ``onnx-optax train`` (``--plot``): a matplotlib PNG."""

from __future__ import annotations

import math
from typing import Any

from onnx_optax._src.write import write_file


def log_scale(values: list[float]) -> bool:
    """Whether losses read better on a log scale: all positive, spanning more than two decades."""
    return bool(values) and min(values) > 0 and max(values) / min(values) > 100


def plot(path: str, title: str, rows: list[dict[str, Any]]) -> None:
    """Training and validation loss against the step, as a PNG written through the one writer.

    The y axis is logarithmic when the (positive) losses span more than two decades.
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.5, 4.5), layout="constrained")
    axes = figure.subplots()
    curves = [
        ("loss", "training loss (mean since the previous point)", "-"),
        ("val_loss", "validation loss", "o-"),
    ]
    values: list[float] = []
    for key, label, style in curves:
        points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        points = [(s, v) for s, v in points if math.isfinite(v)]
        if points:
            steps, losses = zip(*points, strict=True)
            axes.plot(steps, losses, style, label=label, markersize=3)
            values.extend(losses)
    if log_scale(values):
        axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel("loss" + (" (log scale)" if axes.get_yscale() == "log" else ""))
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    if values:
        axes.legend()
    write_file(path, lambda file: figure.savefig(file, format="png", dpi=110), what="the plot")
