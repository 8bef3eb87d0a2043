"""The looks of a sequential gate (``gate --sequential``, issue #16): which documents each evaluates.

Every task's documents are put in a fixed pseudo-random order (numpy's PCG64 seeded with the
suite's seed and the task name, recorded in each look's manifest) and cut into ``count`` chunks:
look k evaluates chunk k, so the items seen after k looks are a random sample of the task, not
its first quarter (datasets are often sorted by subject or difficulty).

lm-eval 0.4.13 evaluates *every* document of a task whose ``samples`` entry is empty, so a task
with nothing new to evaluate at a look (it stopped early, or it is smaller than ``count``) is
given its first document in the order, already evaluated at look 1, and that repeat is dropped
when the looks are joined (``results/subset.py``).

In a sharded workflow each look is one wave of the matrix: ``run --look K/L --shard k/N`` (a
``Look`` with ``part`` (k, N)) evaluates the k-th of N contiguous slices of look K's new
documents, and ``gate --sequential --run DIR`` judges the looks found in DIR.

``gatekeeper run --complete`` evaluates what a stopped gate skipped as one more "look" whose
documents are given (``Look.docs``): every task's documents no look evaluated, so the looks and
the rest together are the whole run (``run/merge.py`` joins them).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Look:
    """Look ``index`` (1-based) of ``count``; ``done``: tasks that stopped early (nothing new);
    ``docs``: the documents to evaluate, given (``run --complete``'s rest, index ``count + 1``);
    ``part``: (k, N), only the k-th of N slices of the look's documents (one shard of a wave)."""

    index: int
    count: int
    seed: int
    done: frozenset[str] = field(default_factory=frozenset)
    docs: Mapping[str, Sequence[int]] | None = field(default=None, compare=False)
    part: tuple[int, int] | None = None

    @property
    def is_rest(self) -> bool:
        return self.docs is not None


def order(task: str, size: int, seed: int) -> np.ndarray:
    """The task's documents in the look order (the same on every machine for the same seed)."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(task.encode("utf-8"))])
    return rng.permutation(size)


def chunk(task: str, size: int, look: Look) -> list[int]:
    """The documents look ``look`` adds for ``task``, sorted (lm-eval labels the i-th selected
    document with ``samples[task][i]``)."""
    if look.docs is not None:
        return sorted(int(i) for i in look.docs.get(task, ()))
    if task in look.done:
        return []
    perm = order(task, size, look.seed)
    lo, hi = round(size * (look.index - 1) / look.count), round(size * look.index / look.count)
    docs = sorted(int(i) for i in perm[lo:hi])
    if look.part is not None:
        k, n = look.part
        docs = docs[round(len(docs) * (k - 1) / n):round(len(docs) * k / n)]
    return docs


def samples(sizes: dict[str, int], look: Look) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """(lm-eval's ``samples`` argument, the documents that are new at this look) per task."""
    lm, new = {}, {}
    for task, size in sorted(sizes.items()):
        docs = chunk(task, size, look)
        new[task] = docs
        lm[task] = docs or [int(order(task, size, look.seed)[0])]  # never empty: see the module docstring
    return lm, new


def rest(sizes: Mapping[str, int], seen: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    """Per task, the documents no look evaluated (``seen``: the documents the looks added)."""
    return {task: sorted(set(range(int(size))) - {int(d) for d in seen.get(task, ())})
            for task, size in sorted(sizes.items())}
