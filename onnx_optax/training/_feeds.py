"""Feeds given as Python numbers (scalars, nested lists) as arrays of the declared dtype."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np


def is_python(value: Any) -> bool:
    """Whether ``value`` is Python numbers (a bool, int, float, list or tuple), not an array."""
    return isinstance(value, bool | int | float | list | tuple)


def from_python(where: str, name: str, value: Any, want: np.dtype | None) -> np.ndarray:
    """``value`` (Python numbers) as an array of ``want``, as ``numpy.asarray`` would make it.

    Refuses, naming the feed, what the conversion would change: a value
    that is not an integer for an integer dtype, one out of the dtype's range
    (or that becomes infinite in a float dtype), one other than 0 or 1 for
    bool; and what is no array of numbers (ragged lists, strings). ``want``
    None (the graph declares no dtype): numpy's own choice.
    """
    label = f"{where}: feed '{name}'"
    try:
        array = np.asarray(value)
    except ValueError as error:  # ragged nested lists
        raise ValueError(f"{label} is not an array of one shape: {error}") from None
    if array.dtype == object:
        raise ValueError(
            f"{label} holds values numpy keeps as Python objects (integers beyond 64 bits, "
            "None, ...), not numbers" + (f" {want} holds" if want else "")
        )
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{label} holds {array.dtype} values; give numbers")
    if want is None or array.dtype == want:
        return array
    if jnp.issubdtype(want, jnp.floating):
        with np.errstate(over="ignore", invalid="ignore"):
            converted = array.astype(want)
        bad = ~np.isfinite(converted.astype(np.float64)) & np.isfinite(array)
        why = f"outside the range of {want}"
    elif jnp.issubdtype(want, jnp.integer):
        info = np.iinfo(want)
        if array.dtype.kind == "f":
            bad = ~np.isfinite(array) | (array != np.round(array))
            bad |= (array < float(info.min)) | (array > float(info.max))
        else:
            values = array.astype(object)  # Python ints: exact against any integer range
            bad = (values < int(info.min)) | (values > int(info.max))
        why = f"not an integer in the range of {want}"
        if not bad.any():
            with np.errstate(over="ignore", invalid="ignore"):
                converted = array.astype(want)
            bad = converted.astype(array.dtype) != array  # float64 rounding at int64's edges
    elif want == np.bool_:
        bad = (array != 0) & (array != 1)
        converted = array.astype(want)
        why = "neither 0 nor 1, for bool"
    else:
        raise TypeError(f"{label} is Python numbers; the graph declares {want}: give an array")
    bad = np.asarray(bad)
    if bad.any():
        shown = np.asarray(array[bad]).reshape(-1)[0].item()
        raise ValueError(
            f"{label}: the value {shown!r} is {why}; converting it would change it. Give "
            f"values {want} holds, or a numpy array of dtype {want}"
        )
    return np.asarray(converted)
