"""Text features over integer tokens: TfIdfVectorizer (ai.onnx).

XLA holds no strings, so the tokens are int32 or int64 ids (``pool_int64s``);
``pool_strings`` and string inputs are refused by name. As in onnxruntime, a
pool whose attributes disagree (gram lengths beyond ``ngram_counts``, fewer
``ngram_indexes`` than n-grams, ``weights`` not one per index, an n-gram
listed twice) and an X of no rows are refused by name. The n-gram pool is read
when the graph is prepared: the n-grams of size ``n`` are the ``n``-long runs
of ``pool_int64s[ngram_counts[n-1]:ngram_counts[n]]``, numbered in pool order
across all sizes, and n-gram ``k`` counts into column ``ngram_indexes[k]``.

Counting follows onnx's reference and onnxruntime: for each skip distance
``d`` in ``1 .. max_skip_count + 1`` and each start ``s`` of a row, the gram
``X[s], X[s+d], ..., X[s+(n-1)d]`` of each size ``n`` in
``[min_gram_length, max_gram_length]`` that fits in the row counts once;
unigrams count at ``d = 1`` only. Each (size, distance) pair is one
comparison of every window with every pooled n-gram of that size, so the
computation is a fixed set of array ops, with no loop over rows or tokens.
"""

from __future__ import annotations

import itertools
from typing import Any

import jax.numpy as jnp
import numpy as np

from onnx_optax._src.onnx_tensors import STRINGS_ADVICE
from onnx_optax._src.ops.arrays import check_size
from onnx_optax._src.ops.guard import register
from onnx_optax._src.ops.registry import Node

_MODES = ("TF", "IDF", "TFIDF")


def _pool(node: Node) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """``{n: (grams [K, n] int64, their output columns [K])}`` for the sizes counted."""
    if node.get("pool_strings"):
        raise ValueError(f"{node.where}: its pool is strings (pool_strings); {STRINGS_ADVICE}")
    if node["mode"] not in _MODES:
        raise ValueError(f"{node.where}: mode {node['mode']!r} is not one of {', '.join(_MODES)}")
    pool = np.asarray(node.get("pool_int64s") or [], np.int64)
    counts = [int(c) for c in node.get("ngram_counts") or []]
    indexes = np.asarray(node.get("ngram_indexes") or [], np.int64)
    low, high = int(node["min_gram_length"]), int(node["max_gram_length"])
    if not 1 <= low <= high:
        raise ValueError(
            f"{node.where}: min_gram_length {low} and max_gram_length {high} must satisfy "
            "1 <= min <= max"
        )
    if int(node["max_skip_count"]) < 0:
        raise ValueError(
            f"{node.where}: max_skip_count is {node['max_skip_count']}; it must be >= 0"
        )
    required = (("ngram_counts", counts), ("ngram_indexes", indexes), ("pool_int64s", pool))
    for name, given in required:
        if not len(given):
            raise ValueError(f"{node.where}: {name} is empty; it is required")
    for name, length in (("min_gram_length", low), ("max_gram_length", high)):
        if length > len(counts):
            raise ValueError(
                f"{node.where}: {name} {length} counts n-grams longer than the {len(counts)} "
                "sizes ngram_counts gives"
            )
    bounds = [*counts, pool.size]
    if any(b < a for a, b in itertools.pairwise(bounds)) or counts[0] < 0:
        raise ValueError(
            f"{node.where}: ngram_counts {counts[:8]} must be non-decreasing offsets into the "
            f"pool of {pool.size} items"
        )
    grams: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    first = 0  # the number of the segment's first n-gram
    for n, (start, end) in enumerate(itertools.pairwise(bounds), start=1):
        if (end - start) % n:
            raise ValueError(
                f"{node.where}: the pool's {n}-grams ({start}:{end}) are {end - start} items, "
                f"no whole number of {n}-grams"
            )
        k = (end - start) // n
        if low <= n <= high and k:
            segment = pool[start:end].reshape(k, n)
            unique, seen = np.unique(segment, axis=0, return_counts=True)
            if (seen > 1).any():  # a gram counted into two columns (onnxruntime refuses it)
                twice = unique[np.argmax(seen > 1)].tolist()
                raise ValueError(f"{node.where}: pool_int64s holds the {n}-gram {twice} twice")
            grams[n] = (segment, np.arange(first, first + k))
        first += k
    if indexes.size < first:
        raise ValueError(
            f"{node.where}: {indexes.size} ngram_indexes for the pool's {first} n-grams; give "
            "one output column per n-gram"
        )
    if (indexes < 0).any():
        raise ValueError(f"{node.where}: ngram_indexes holds {int(indexes.min())}; it must be >= 0")
    weights = node.get("weights")
    if weights is not None and len(weights) != indexes.size:
        raise ValueError(
            f"{node.where}: {len(weights)} weights for {indexes.size} ngram_indexes; give one "
            "weight per index"
        )
    if weights is not None and len(weights) <= int(indexes.max()):
        raise ValueError(
            f"{node.where}: {len(weights)} weights for {int(indexes.max()) + 1} output columns"
        )
    return {n: (g, indexes[ids]) for n, (g, ids) in grams.items()}


def _check(node: Node) -> None:
    _pool(node)


@register("TfIdfVectorizer", check=_check)
def _tfidf_vectorizer(node: Node, x: Any) -> Any:
    """``[B, columns]`` (or ``[columns]`` for a 1-D X) n-gram counts, then weighted.

    ``TF``: the counts; ``IDF``: ``weights[col]`` (else 1) where a count is
    positive; ``TFIDF``: ``weights[col] * count`` (else the count). Columns:
    ``max(ngram_indexes) + 1``; the output is float32.
    """
    grams = _pool(node)
    indexes = np.asarray(node.get("ngram_indexes") or [], np.int64)
    columns = int(indexes.max()) + 1 if indexes.size else 0
    if np.ndim(x) > 2:
        raise ValueError(
            f"{node.where}: input X has shape {list(np.shape(x))}; it must be [C] or [B, C]"
        )
    if np.ndim(x) == 2 and not np.shape(x)[0]:
        raise ValueError(
            f"{node.where}: input X has shape {list(np.shape(x))}; [B, C] needs B > 0 rows"
        )
    x = jnp.asarray(x)
    rows = x.reshape(1, -1) if x.ndim < 2 else x
    width = rows.shape[1]
    check_size(node, (rows.shape[0], columns), np.float32)
    counts = jnp.zeros((rows.shape[0], columns), np.float32)
    held = np.iinfo(np.dtype(rows.dtype))
    for n, (pooled, cols) in grams.items():
        keep = ((pooled >= held.min) & (pooled <= held.max)).all(axis=1)  # else never matched
        pooled, cols = pooled[keep].astype(rows.dtype), cols[keep]
        if not pooled.size:
            continue
        distances = range(1, int(node["max_skip_count"]) + 2) if n > 1 else (1,)
        for d in distances:
            starts = width - (n - 1) * d
            if starts <= 0:
                break
            check_size(node, (rows.shape[0], starts, cols.size, n), np.bool_, "n-gram matches")
            windows = jnp.stack([rows[:, i * d : i * d + starts] for i in range(n)], axis=-1)
            found = jnp.all(windows[:, :, None, :] == jnp.asarray(pooled), axis=-1)
            per_gram = jnp.sum(found, axis=1, dtype=np.float32)  # [B, K]
            counts = counts.at[:, jnp.asarray(cols)].add(per_gram)
    weights = np.asarray(node.get("weights") or [], np.float32)
    mode = node["mode"]
    if mode == "IDF":
        scale = jnp.asarray(weights[:columns]) if weights.size else 1.0
        counts = jnp.where(counts > 0, scale, 0.0).astype(np.float32)
    elif mode == "TFIDF" and weights.size:
        counts = counts * jnp.asarray(weights[:columns])
    return counts.reshape(-1) if x.ndim < 2 else counts
