"""``gatekeeper run --shard K/N``: which documents of each task shard K of N evaluates.

The split is a pure function of the per-task item counts (what lm-eval would evaluate
unsharded, after any limit) and N, so every runner computes the same split from the same
suite without talking to the others.

Every task is cut into N contiguous, near-equal chunks of document indices (a 12k-item task
spreads over N GPUs; a small task costs each shard a few items). The remainders are handed out
round-robin across tasks, so shard sizes differ by at most one item over the whole suite.
Every shard gets at least one document of every task: lm-eval 0.4.13 evaluates *all*
documents of a task whose ``samples`` entry is empty or missing, and refuses a task with no
documents, so a task smaller than N cannot be sharded (one-line error, no silent full run).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gatekeeper.errors import GateError

# One shard per GPU runner: more is a typo (and a merge of 1e9 shard ranges would run for minutes).
MAX_SHARDS = 1024
_SHARD_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """``"K/N"`` with 1 <= K <= N; GateError naming the flag otherwise."""
    m = _SHARD_RE.match(str(text))
    if m is None:
        raise GateError(f"--shard {text}: expected K/N (for example 2/4), K from 1")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1 or not 1 <= index <= count:
        raise GateError(f"--shard {text}: K must be between 1 and N (N >= 1)")
    if count > MAX_SHARDS:
        raise GateError(f"--shard {text}: at most {MAX_SHARDS} shards (one per GPU runner)")
    return Shard(index, count)


def split(sizes: dict[str, int], count: int) -> list[dict[str, tuple[int, int]]]:
    """For each of ``count`` shards, ``{task: (first, end)}`` document index ranges.

    ``sizes`` is ``{task: number of documents evaluated unsharded}``; tasks are taken in
    sorted name order so the split does not depend on the order lm-eval loaded them."""
    small = {t: n for t, n in sizes.items() if n < count}
    if small:
        task, n = sorted(small.items())[0]
        raise GateError(
            f"--shard: task {task} has {n} item(s), fewer than the {count} shards; "
            f"use at most {n} shards (every shard evaluates part of every task)"
        )
    shards: list[dict[str, tuple[int, int]]] = [{} for _ in range(count)]
    offset = 0  # which shard gets the next left-over item: keeps the totals within one
    for task in sorted(sizes):
        n = sizes[task]
        base, extra = divmod(n, count)
        start = 0
        for j in range(count):
            size = base + (1 if (j - offset) % count < extra else 0)
            shards[j][task] = (start, start + size)
            start += size
        offset = (offset + extra) % count
    return shards


def selection(sizes: dict[str, int], shard: Shard) -> dict[str, tuple[int, int]]:
    """The document ranges shard ``shard`` evaluates."""
    return split(sizes, shard.count)[shard.index - 1]
