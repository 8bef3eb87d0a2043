"""How the suite's alpha is shared among its gated rows: the multiplicity design.

One flat Holm family treats an lm-eval group's row as one more hypothesis beside its subtasks:
MMLU's row then holds alpha/58, and a 0.5-point loss spread over all 57 subjects, which only the
pooled row can see, was caught 49% of the time. The design here is a graphical procedure (Bretz,
Maurer, Brannath & Posch 2009; ``stats/multiplicity.Graph``):

- **group rows first**: the rows of top-level groups (a group no gated group row of the same
  metric holds) share ``policy.group_share`` of alpha (default half); every other gated row
  (subtasks, nested groups, standalone tasks) shares the rest equally;
- a rejected group row passes its share to its members' rows of the same metric and filter
  (nested groups pass it on in turn: mmlu → its 4 categories → their subjects);
- any other rejected row passes its share to all the rows left, in proportion to their
  starting shares (Holm's step-down, weighted).

Any such graph holds the chance of a false alarm anywhere in the suite at alpha. With no group
row (or ``group_share: 0``) it is exactly Holm. The anchor's rows (a drift check) are the same
family: each side's group rows are group rows. Bonferroni uses the starting shares without
passing them on. Measured on an MMLU-sized group (57 subjects, 14,042 items; benchmarks/
alpha_design.py): a diffuse 0.5-point loss caught about 38% of the time before, 80% after; one
265-item subject 8 points worse, 80% before, 74-77% after.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gatekeeper.compare.stats.multiplicity import Graph
from gatekeeper.model import SeriesKey

DEFAULT_GROUP_SHARE = 0.5


@dataclass(frozen=True)
class Row:
    """What the design needs of one gated row: its key, its side (0: against the baseline, 1:
    against the anchor) and, for a group's row, its leaf tasks."""

    key: SeriesKey
    side: int = 0
    subtasks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Design:
    graph: Graph
    top_groups: int  # rows that started with the group share
    share: float  # the share of alpha they started with, together (0 when there are none)
    parent: tuple[int | None, ...]  # each row's group row in the family, None at the top


def design(rows: list[Row], parents: Callable[[str], tuple[str, ...]], share: float = DEFAULT_GROUP_SHARE,
           correction: str = "holm", min_p: list[float] | None = None, alpha: float = 0.05) -> Design:
    """The graph of ``rows`` (see the module docstring). ``parents(task)``: the groups holding a
    task, nearest first (``RunResults.parents``). ``min_p``: the smallest p-value each row's test
    can reach given what it conditions on (McNemar: 0.5^(flips+1) for its number of flipped items;
    0 for the others): the rows that start with the rest of alpha share it among those that can
    reach their level (Tarone 1990), see ``_reachable``."""
    m = len(rows)
    index = {(r.side, r.key): i for i, r in enumerate(rows)}
    parent = tuple(_parent(r, index, parents) for r in rows)
    top = np.array([bool(r.subtasks) and parent[i] is None for i, r in enumerate(rows)])
    if m == 0 or share <= 0 or not top.any() or top.all():
        graph = Graph.holm(m)
        used = 0.0
    else:
        rest = np.flatnonzero(~top)
        reach = _reachable(np.asarray(min_p if min_p is not None else np.zeros(m))[rest], alpha * (1.0 - share))
        weights = np.where(top, share / top.sum(), 0.0)
        weights[rest[reach]] = (1.0 - share) / reach.sum()
        g = np.zeros((m, m))
        for i in range(m):
            children = [j for j in range(m) if parent[j] == i]
            if children:  # a group row: its share goes to its members' rows
                g[i, children] = 1.0 / len(children)
            else:  # weighted Holm: to every other row, in proportion to their starting shares
                others = weights.copy()
                others[i] = 0.0
                g[i] = others / others.sum() if others.sum() > 0 else 0.0
        graph, used = Graph(weights, g), share
    if correction == "bonferroni":
        graph = Graph(graph.weights, np.zeros((m, m)))
    return Design(graph, int(top.sum()) if used else 0, used, parent)


def _reachable(min_p: np.ndarray, budget: float) -> np.ndarray:
    """Which of the rows sharing ``budget`` get a share (Tarone 1990): the smallest K such that at
    most K rows can reach ``budget / K`` at all; those rows share it, the others start with none
    (they could never be rejected at their share: a subject of 100 items with 4 flipped ones has
    no p-value below 1/32); at least one row always shares.

    What holds: each McNemar test conditions on its number of flipped items, which decides
    ``min_p`` and is all the choice uses, so the choice is fixed given the flips. A share chosen
    this way lies just above mid-p's smallest value, where mid-p rejects more often than the share
    (up to twice). The gate therefore bounds, given the flips, the chance that a harmless change
    (every hypothesis true) is rejected anywhere: the sum of each row's exact size at its starting
    share, where the procedure's first rejection happens; when that sum exceeds alpha the design
    runs at the fraction of alpha that brings it back (``compare._discreteness_scale``). After a
    true rejection passes shares on, the other rows are as valid as mid-p is (close to the level
    on average), as in plain Holm."""
    k = 1
    while k < min_p.size and np.count_nonzero(min_p <= budget / k) > k:
        k += 1
    reach = min_p <= budget / k
    return reach if reach.any() else np.ones(min_p.size, dtype=bool)


def _parent(row: Row, index: dict[tuple[int, SeriesKey], int],
            parents: Callable[[str], tuple[str, ...]]) -> int | None:
    """The nearest group holding ``row``'s task that has a row of the same metric, filter and side."""
    for group in parents(row.key.task):
        hit = index.get((row.side, SeriesKey(group, row.key.filter, row.key.metric)))
        if hit is not None:
            return hit
    return None


def describe(d: Design, correction: str, gated: int) -> str:
    """How alpha was shared, in one line for the report's footnote."""
    if correction not in ("holm", "bonferroni"):
        return f"{correction} correction over {gated} gated metrics"
    if not d.top_groups:
        return f"{correction} correction over {gated} gated metrics"
    rest = gated - d.top_groups
    rows = "row" if d.top_groups == 1 else "rows"
    passing = ("a rejected group row passes its share to its members, any other rejected row to the rest "
               "(weighted Holm)" if correction == "holm" else "nothing is passed on (weighted Bonferroni)")
    idle = int(np.count_nonzero(d.graph.weights == 0))
    reach = (f" ({idle} of them start with none: too few flipped items to reach a share, Tarone)" if idle else "")
    return (f"group {rows} first: {d.top_groups} group {rows} at {_share(d.share)} of alpha, the other {rest} gated "
            f"{'row' if rest == 1 else 'rows'} share{'s' if rest == 1 else ''} the rest{reach}; {passing}")


def _share(x: float) -> str:
    return {0.5: "half", 0.25: "a quarter", 0.75: "three quarters"}.get(round(x, 6), f"{x:g}")
