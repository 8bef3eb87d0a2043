"""Informative items first (issue #57): which items a gate reads, and what each read item stands
for, decided from the baseline alone.

A paired test of right/wrong items learns only from the items that flip, and flips are not spread
evenly: a multiple-choice item the baseline answered with a wide margin (its gold choice's
log-likelihood far from the best other choice's) rarely flips under a small change of the model.
Measured on the demo (benchmarks/flip_propensity.py): the small defects' flips lie at |margin|
ranks whose exponential decay is 0.037 (95% interval 0.025 to 0.060): 99.5% of them in the fifth
of items with the smallest margin. So a task's items are cut into eighths by the baseline's
|margin|, smallest first, and eighth h is read with probability ``SHARES[h]`` (1, 1/2, 1/4, 1/8,
then 1/16: 27% of the items), about the square root of that curve's propensity (the reading that
keeps most of the information per item read: Neyman's allocation). Each item is drawn on its own
(Poisson sampling) by a uniform number fixed by the seed, the task and the document, so every
process, a sharded gate's judge included, draws the same items. An item read at probability pi
stands for 1/pi items (Horvitz-Thompson): the estimate of the whole task's change is unbiased
whatever the flips, and the weights are integers, which keeps the test's null distribution exact
(``compare/stats/weighted.py``). A right/wrong task whose baseline kept no margins is read
uniformly (``UNIFORM_SHARE``); a task that cannot be weighted exactly (continuous metrics,
clusters) is read whole.

Looks nest: at a fraction t of the design, item i is read when u_i < t * pi_i, so the items of
look k are among those of look k + 1 and each read item's weight is 1 / (t * pi_i); at t = 1 the
design's items are read; at t = 1 / min(pi) every item is.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gatekeeper.errors import GateError
from gatekeeper.model import RunResults, Sample
from gatekeeper.results import groups

# The share of each |margin| eighth read, smallest margin first. Powers of two: every read item's
# weight relative to the others is an integer, so the weighted flips' null distribution is exact.
SHARES = (1.0, 0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0625, 0.0625)
# The stages read one after another (Design.read's scale): 27%, 41%, 56%, 75% and every item.
SCALES = (1.0, 2.0, 4.0, 8.0, 16.0)
# A right/wrong task whose baseline kept no margins (a generation task, or a baseline recorded
# before them) is read uniformly: each item at this chance, so its stages read a quarter, half and
# every item (a sequential gate's looks), passing early where no drop is to be found.
UNIFORM_SHARE = 0.25
# What ``plan`` assumes of a harmless change's flips: item i flips with a chance proportional to
# exp(-rank_i / PROPENSITY_DECAY), rank_i its |margin| rank in [0, 1) smallest first. The least
# concentrated curve the demo's measured flips allow (benchmarks/flip_propensity.py: decay 0.037,
# 95% interval 0.025 to 0.060): 96% of the flips in the smallest-margin fifth.
PROPENSITY_DECAY = 0.06


def choice_margin(loglikelihoods: Sequence[float], gold: int) -> float:
    """The gold choice's log-likelihood less the best other choice's: acc's margin (negative
    where the baseline was wrong). NaN with fewer than two choices or a gold index outside them."""
    lls = np.asarray(loglikelihoods, dtype=float)
    if lls.size < 2 or not 0 <= gold < lls.size:
        return float("nan")
    return float(lls[gold] - np.delete(lls, gold).max())


def line_margin(filtered_resps: Any, target: Any, acc: Any) -> float:
    """acc's margin from one samples line of a multiple-choice task. ``filtered_resps``: each
    choice's [log-likelihood, is_greedy] (lm-eval 0.4.13 writes both as strings); ``target``: the
    gold choice's index (an integer, or its digits as a string). NaN unless all of that reads and
    the margin's sign agrees with acc (a right answer has the gold choice on top): a task whose
    gold is text, or several golds, has no margin, and its items are read with certainty."""
    target = _index(target)
    if target < 0 or not isinstance(filtered_resps, list):
        return math.nan
    try:
        lls = [float(r[0]) for r in filtered_resps]
    except (TypeError, ValueError, IndexError, KeyError, OverflowError):
        return math.nan
    margin = choice_margin(lls, target)
    if not math.isfinite(margin) or not isinstance(acc, (int, float)) or isinstance(acc, bool):
        return math.nan
    if (margin > 0 and acc != 1) or (margin < 0 and acc != 0):
        return math.nan
    return margin


def line_margins(resps: list[Any], targets: list[Any], accs: list[Any]) -> np.ndarray:
    """``line_margin`` of many lines at once: in bulk where every line reads (numpy parses the
    log-likelihoods' strings; one reduction over all choices), else line by line."""
    try:
        counts = np.fromiter(map(len, resps), dtype=np.int64, count=len(resps))
        if not resps or counts.min() < 2 or not all(type(r) is list for r in resps):
            raise ValueError
        lls = np.asarray([c[0] for r in resps for c in r], dtype=float)
        gold = np.asarray([_index(t) for t in targets], dtype=np.int64)
        acc = np.asarray(accs, dtype=float)
    except (TypeError, ValueError, IndexError, KeyError, OverflowError):
        return np.array([line_margin(*line) for line in zip(resps, targets, accs, strict=True)], dtype=float)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    ok = (gold >= 0) & (gold < counts)
    at = starts + np.where(ok, gold, 0)
    gold_ll = lls[at]
    others = lls.copy()
    others[at] = -np.inf
    margin = gold_ll - np.maximum.reduceat(others, starts)
    agrees = np.where(margin > 0, acc == 1, np.where(margin < 0, acc == 0, True))
    return np.where(ok & np.isfinite(margin) & agrees, margin, np.nan)


def _index(target: Any) -> int:
    """The gold index a samples line's target names, or -1."""
    if isinstance(target, bool):
        return -1
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.strip().isascii() and target.strip().isdigit():
        return int(target)
    return -1


def uniforms(task: str, size: int, seed: int) -> np.ndarray:
    """One uniform number in [0, 1) per document of the task, the same on every machine for the
    same seed (numpy's PCG64 seeded as a sequential gate's look order is, with a third word so
    that the two draws are independent)."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(task.encode("utf-8")), 57])
    return rng.random(size)


def strata(margins: np.ndarray, count: int = len(SHARES)) -> np.ndarray:
    """Each item's stratum: 0 for the ``count``-th part with the smallest |margin|, up to
    count - 1; -1 for an item with no margin (NaN). Ties are cut by document order."""
    margins = np.abs(np.asarray(margins, dtype=float))
    known = ~np.isnan(margins)
    out = np.full(margins.size, -1, dtype=np.int64)
    ranks = np.empty(int(known.sum()), dtype=np.int64)
    ranks[np.argsort(margins[known], kind="stable")] = np.arange(ranks.size)
    out[known] = ranks * count // max(1, ranks.size)
    return out


@dataclass(frozen=True)
class Design:
    """One task's informative design: each document's inclusion probability at t = 1 (``pi``)
    and its uniform number (``u``), indexed by doc_id (0 .. size - 1)."""

    task: str
    pi: np.ndarray
    u: np.ndarray
    uniform: bool = False  # no margins: every item at UNIFORM_SHARE

    def read(self, t: float = 1.0) -> np.ndarray:
        """Which documents are read at scale ``t`` of the design (a bool per doc_id; t = 1 the
        design's own items, 1 / min(pi) every item; relative weights stay integers for t a power
        of two)."""
        return self.u < t * self.pi

    def weights(self, doc_ids: np.ndarray, t: float = 1.0) -> np.ndarray:
        """What each read document stands for: 1 / (t * pi), at least 1 (read with certainty)."""
        return 1.0 / np.minimum(1.0, t * self.pi[np.asarray(doc_ids, dtype=np.int64)])

    def expected_share(self, t: float = 1.0) -> float:
        """The expected share of the task's documents read at fraction ``t``."""
        return float(np.minimum(1.0, t * self.pi).mean()) if self.pi.size else 0.0


def design(task: str, margins: np.ndarray, seed: int, shares: Sequence[float] = SHARES,
           doc_ids: np.ndarray | None = None) -> Design:
    """The design of a task whose documents 0 .. n - 1 have the baseline's choice ``margins``
    (NaN: none, read with certainty), or, with ``doc_ids``, whose documents ``doc_ids`` have them
    (as a baseline stores them; a document not among them has none). ``shares``: the probability
    each |margin| stratum is read, smallest margin first; each in (0, 1] and 1 / share an integer
    power of two (exact weights)."""
    if doc_ids is not None:
        doc_ids = np.asarray(doc_ids, dtype=np.int64)
        dense = np.full(int(doc_ids.max()) + 1 if doc_ids.size else 0, np.nan)
        dense[doc_ids] = margins
        margins = dense
    shares = np.asarray(shares, dtype=float)
    if shares.size == 0 or np.any(shares <= 0) or np.any(shares > 1):
        raise ValueError(f"shares must lie in (0, 1], got {shares.tolist()}")
    inverse = np.log2(1.0 / shares)
    if not np.allclose(inverse, np.round(inverse)):
        raise ValueError(f"each share must be 1 / 2^k (exact integer weights), got {shares.tolist()}")
    level = strata(margins, shares.size)
    pi = np.where(level < 0, 1.0, shares[np.maximum(level, 0)])
    return Design(task, pi, uniforms(task, pi.size, seed))


def designs_for(baseline: RunResults, seed: int, shares: Sequence[float] = SHARES
                ) -> tuple[dict[str, Design], dict[str, str]]:
    """Each task's design from the baseline alone, and why a task is read whole (every item read
    with certainty, each standing for itself): only right/wrong items without clusters can be
    weighted exactly, by their choice margins where the baseline kept them, else uniformly
    (``UNIFORM_SHARE``); a subtask of a group that averages its subtasks' scores cannot yet. The
    comparison refuses any other read of part of a task."""
    whole: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for key, s in sorted(baseline.series.items(), key=lambda kv: str(kv[0])):
        ids = np.asarray(s.doc_ids, dtype=np.int64)
        sizes[key.task] = int(ids.size)
        values = np.asarray(s.values)
        if key.task in whole:
            continue
        if not np.array_equal(ids, np.arange(ids.size)):
            whole[key.task] = "its documents are not numbered 0 to n - 1"
        elif s.clusters is not None:
            whole[key.task] = f"its items are clustered ({key.metric})"
        elif values.ndim != 1 or values.dtype == object or not np.isin(values, (0.0, 1.0)).all():
            whole[key.task] = f"{key.metric} is not right/wrong"
    for key in baseline.untestable:
        whole.setdefault(key.task, f"{key.metric} cannot be tested")
    for gm in groups.group_metrics(baseline)[0]:
        if not gm.weight_by_size:
            for leaf in gm.leaves:
                whole.setdefault(leaf, f"group {gm.group} averages its subtasks' scores")
    designs = {}
    for task, n in sizes.items():
        margins = baseline.choice_margins.get(task)
        if task in whole:
            designs[task] = Design(task, np.ones(n), uniforms(task, n, seed))
            continue
        if margins is None:
            designs[task] = Design(task, np.full(n, UNIFORM_SHARE), uniforms(task, n, seed), uniform=True)
            continue
        d = design(task, margins[1], seed, shares, doc_ids=margins[0])
        if d.pi.size < n:  # documents the margins do not list: read with certainty
            d = Design(task, np.concatenate([d.pi, np.ones(n - d.pi.size)]), uniforms(task, n, seed))
        designs[task] = Design(task, d.pi[:n], d.u[:n])
    return designs, whole


def stage_units(baseline: RunResults, designs: Mapping[str, Design], whole: Mapping[str, str]) -> list[tuple[str, ...]]:
    """The tasks that choose their stage together: the subtasks of each outermost size-weighted
    group (the flips of all of them say when the group, and each subject under Tarone's design,
    has read enough: benchmarks/informative_group.py), every other task on its own. Tasks read
    whole are left out (they are read at the first stage)."""
    read_in_part = [t for t in sorted(designs) if t not in whole]
    metrics = sorted((gm for gm in groups.group_metrics(baseline)[0] if gm.weight_by_size),
                     key=lambda gm: (-len(gm.leaves), gm.group))
    units: list[tuple[str, ...]] = []
    placed: set[str] = set()
    for gm in metrics:  # the largest group first: a subgroup's tasks are already in it
        members = tuple(t for t in gm.leaves if t in read_in_part and t not in placed)
        if members:
            units.append(members)
            placed.update(members)
    return units + [(t,) for t in read_in_part if t not in placed]


def joined(designs: Mapping[str, Design], tasks: Sequence[str]) -> Design:
    """One design over several tasks' documents, in the order of ``tasks`` (for the stage rule)."""
    if len(tasks) == 1:
        return designs[tasks[0]]
    return Design("+".join(tasks), np.concatenate([designs[t].pi for t in tasks]),
                  np.concatenate([designs[t].u for t in tasks]), all(designs[t].uniform for t in tasks))


def weigh(run: RunResults, designs: Mapping[str, Design], scale: float | Mapping[str, float]) -> RunResults:
    """``run`` (the items a gate read) with each series of a designed task given what its items
    stand for at ``scale`` of the design (``Sample``); the comparison then estimates and tests the
    whole task's change. The items must be exactly those the design reads at that scale, and every
    task of the run must have a design: a run that read other items, or fewer, is an error, never a
    silently wrong weight or a biased estimate."""
    series = {}
    for key, s in run.series.items():
        d = designs.get(key.task)
        at = scale if isinstance(scale, (int, float)) else scale.get(key.task, 1.0)
        if d is None:
            raise GateError(f"{run.provenance.source}: task {key.task} has no informative design; the items read "
                            "were chosen for other tasks")
        ids = np.asarray(s.doc_ids, dtype=np.int64)
        outside = ids[(ids < 0) | (ids >= d.pi.size)]
        if outside.size:
            raise GateError(f"{run.provenance.source}: task {key.task} has document {int(outside[0])}, but the "
                            f"design (from the baseline) has {d.pi.size} documents")
        unread = ids[~d.read(at)[ids]]
        if unread.size:
            raise GateError(f"{run.provenance.source}: task {key.task} holds document {int(unread[0])}, which the "
                            f"informative design does not read at scale {at:g} ({unread.size} such); "
                            "the run read other items than the design's")
        missing = np.setdiff1d(np.flatnonzero(d.read(at)), ids)
        if missing.size:  # an item drawn but not read would count as unchanged: the estimate biased
            raise GateError(f"{run.provenance.source}: task {key.task} lacks document {int(missing[0])}, which the "
                            f"informative design reads at scale {at:g} ({missing.size} such)")
        series[key] = replace(s, sample=Sample(d.weights(ids, at), int(d.pi.size)))
    return replace(run, series=series)


def margin_ranks(baseline: RunResults, task: str, n: int) -> np.ndarray | None:
    """Each document's |margin| rank in [0, 1), smallest first (NaN margins last), or None when the
    baseline kept no margins for the task."""
    kept = baseline.choice_margins.get(task)
    if kept is None:
        return None
    dense = np.full(n, np.inf)
    ids, margins = kept
    inside = (ids >= 0) & (ids < n)
    dense[ids[inside]] = np.abs(np.where(np.isnan(margins[inside]), np.inf, margins[inside]))
    ranks = np.empty(n)
    ranks[np.argsort(dense, kind="stable")] = np.arange(n) / max(1, n)
    return ranks
