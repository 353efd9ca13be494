"""Reading named arrays from a stranger's ``.npz`` file: only those asked for, each capped.

``numpy.load`` inflates whatever member it is asked for, trusting the sizes the
file declares. Here a member is opened only if its array is asked for, its
declared sizes (the zip's and the ``.npy`` header's) are checked against a
limit before a byte is inflated, no more bytes are read than the header's
shape and dtype need, and arrays of Python objects (pickles) are refused.
"""

from __future__ import annotations

import math
import os
import zipfile
from collections import Counter
from collections.abc import Sequence

import numpy as np

from onnx_optax._src.limits import MAX_TENSOR_BYTES

# The bytes of all arrays read together: the limit on a model's tensors.
MAX_BYTES = MAX_TENSOR_BYTES
# The most bytes of a .npy header (numpy's own default max_header_size) and what precedes it.
_HEADER_BYTES = 10_000 + 16
_CHUNK = 2**20
_SUFFIX = ".npy"


def _read_member(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: int, limit: int
) -> tuple[np.ndarray, int]:
    """The array in ``info`` and its bytes, or a ValueError; reads at most ``budget`` data bytes.

    ``budget`` is what is left of ``limit``, which the messages name.
    """
    label = f"member {info.filename!r}"
    if info.file_size > budget + _HEADER_BYTES:
        raise ValueError(
            f"{label} declares {info.file_size} bytes, more than the {budget} bytes left of the "
            f"limit of {limit}; it was not read"
        )
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
        else:
            raise ValueError(f"{label} is a .npy file of version {version}, not 1.0 or 2.0")
        if dtype.hasobject:
            raise ValueError(f"{label} holds Python objects (a pickle); refused")
        if any(d < 0 for d in shape) or dtype.itemsize == 0:
            raise ValueError(f"{label} declares shape {shape} of {dtype}: no array")
        count = math.prod(shape) * dtype.itemsize
        if count > budget:
            raise ValueError(
                f"{label} declares {dtype}{list(shape)} ({count} bytes), more than the "
                f"{budget} bytes left of the limit of {limit}; it was not read"
            )
        if count > info.file_size - member.tell():
            raise ValueError(
                f"{label} declares {dtype}{list(shape)} ({count} bytes) but holds "
                f"{info.file_size - member.tell()} bytes of data; it is truncated"
            )
        buffer = np.empty(count, np.uint8)
        position = 0
        while position < count:
            chunk = member.read(min(_CHUNK, count - position))
            if not chunk:
                raise ValueError(f"{label} ends after {position} of {count} bytes of data")
            buffer[position : position + len(chunk)] = np.frombuffer(chunk, np.uint8)
            position += len(chunk)
    array = np.ndarray(shape, dtype, buffer=buffer, order="F" if fortran else "C")
    return array, count


def read_npz(
    path: str | os.PathLike[str], names: Sequence[str], *, max_bytes: int | None = None
) -> tuple[dict[str, np.ndarray], list[str]]:
    """The arrays ``names`` that the ``.npz`` file ``path`` holds, and every name it holds.

    Only the members ``<name>.npy`` of ``names`` are opened, in order; each one's
    declared size and ``.npy`` header are checked before it is inflated, against
    what is left of ``max_bytes`` (default :data:`MAX_BYTES`) for all of them
    together. Raises ValueError naming the member (too large, truncated, a
    pickled object array, not a ``.npy`` array, named twice), or for a file that
    is no ``.npz``.
    """
    limit = MAX_BYTES if max_bytes is None else max_bytes
    budget = limit
    with open(path, "rb") as file:
        if file.read(len(np.lib.format.MAGIC_PREFIX)) == np.lib.format.MAGIC_PREFIX:
            raise ValueError("it is a single array (.npy), not an .npz file of named arrays")
    if not zipfile.is_zipfile(path):
        raise ValueError("it is not an .npz file (a zip of .npy arrays)")
    arrays: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        members = {info.filename: info for info in infos}
        # A zip may name a member twice: which one is meant? (counted once, in linear time)
        twice = Counter(i.filename for i in infos) if len(members) < len(infos) else Counter()
        held = [n[: -len(_SUFFIX)] if n.endswith(_SUFFIX) else n for n in members]
        for name in dict.fromkeys(names):
            info = members.get(name + _SUFFIX)
            if info is None:
                if name in members:
                    raise ValueError(f"member {name!r} is not a .npy array")
                continue
            if twice[info.filename] > 1:
                raise ValueError(
                    f"member {info.filename!r} appears {twice[info.filename]} times; it is not "
                    "clear which array is meant"
                )
            arrays[name], count = _read_member(archive, info, budget, limit)
            budget -= count
    return arrays, held
