"""Domain objects shared by every stage: the per-item results of one run (or baseline).

Data flows one way: a reader (``results/reader.py`` for lm-eval output, ``baseline/store.py``
for baseline files) builds a ``RunResults``; ``compare/`` pairs two of them and calls the pure
statistics in ``compare/stats/``; ``report/`` renders the outcome; ``publish/`` talks to GitHub.

Ground floor: imports nothing of gatekeeper, no torch, no lm-eval, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# How per-item values turn into the task score, which decides the statistics used: the name of
# a kind in the registry gatekeeper.results.metrics (KINDS), e.g.
#   "mean":   one float per item; score = mean (acc, acc_norm, exact_match, ...)
#   "ratio":  [loglikelihood, count] per item; score = f(sum ll, sum count)
#   "corpus": [reference, prediction] per item; score = corpus metric (bleu, chrf, chrf++, ter)
Kind = str

# Item hashes are kept as their first 16 hex digits (64 bits), in memory and in baseline files:
# a chance collision is irrelevant at any suite size, and 16 digits take a quarter of the memory.
HASH_CHARS = 16
# In memory as ASCII bytes: numpy's str dtype takes 4 bytes a digit (19 MB more per 100k items).
HASH_DTYPE = f"S{HASH_CHARS}"


@dataclass(frozen=True)
class SeriesKey:
    """Identifies one gated quantity: a metric of a task under one filter."""

    task: str
    filter: str
    metric: str

    def __str__(self) -> str:
        return f"{self.task}/{self.metric},{self.filter}"


@dataclass(frozen=True)
class Sample:
    """The items of a series that an informative design read (``results/informative.py``, issue
    #57), and what they stand for: the comparison estimates the whole task's change from them
    (Horvitz-Thompson) and tests it with the weighted flips' McNemar test."""

    weights: np.ndarray  # per item, aligned with the series' doc_ids: 1 / its inclusion probability
    total: int  # the items of the task (a group: of its subtasks) the read ones stand for


@dataclass
class MetricSeries:
    """Per-item values of one (task, filter, metric), sorted by doc_id.

    values:
      kind "mean":   float64 array, shape (n,). Repeats are already averaged per item.
      kind "ratio":  float64 array, shape (n, 2): [loglikelihood, count].
      kind "corpus": object array, shape (n, 2): [reference, prediction] strings.
      kind "confusion": int64 array, shape (n, 2): [gold, prediction] class labels (f1, mcc).
      kinds "brier", "median": float64 (n,); "nanmean": float64 (n,), NaN allowed.
      kind "function": object array (n,): the JSON value lm-eval logged per item.
      (gatekeeper.results.metrics.KINDS: each kind validates, stores and tests its own shape.)
    hashes: array of hex digits, shape (n, 3): doc_hash, prompt_hash, target_hash. The readers
      keep ``HASH_CHARS`` digits as ASCII bytes (``HASH_DTYPE``); other sources may hold str,
      or more or fewer digits: compare on the common prefix (``np.asarray(h, dtype=str)`` reads any).
    clusters: optional str array, shape (n,): cluster label per item (shared passage, subject).
    sample: set where an informative design read these items out of more (``Sample``).
    reported: the aggregate lm-eval wrote in results.json (None for a baseline file that
      has no results.json; the store keeps it though).
    """

    key: SeriesKey
    kind: Kind
    aggregation: str
    higher_is_better: bool
    doc_ids: np.ndarray
    values: np.ndarray
    hashes: np.ndarray
    reported: float | None = None
    clusters: np.ndarray | None = None
    sample: Sample | None = None  # None: the items are the whole task, each standing for itself

    @property
    def n(self) -> int:
        return int(self.doc_ids.shape[0])


@dataclass
class ItemSnippet:
    """Short, raw (unescaped) text of one item, for the report's "right to wrong" list."""

    prompt: str
    output: str
    target: str


@dataclass
class Provenance:
    """What a reviewer needs to trust that two runs measured the same thing.

    ``configs`` are lm-eval's per-task configs with the model arguments that lm-eval merges
    into ``metadata`` (pretrained, dtype, ...) and ``config_source`` removed, so that two models
    evaluated on the same task have equal configs.
    ``manifest`` is gatekeeper's own run manifest when present (model sha256, hardware, suite
    hash, wall time), else {}.
    """

    source: str
    lm_eval_version: str | None = None
    task_versions: dict[str, Any] = field(default_factory=dict)
    n_shot: dict[str, Any] = field(default_factory=dict)
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    seeds: dict[str, Any] = field(default_factory=dict)
    limit: Any = None
    n_samples: dict[str, dict[str, Any]] = field(default_factory=dict)
    task_hashes: dict[str, str] = field(default_factory=dict)
    model_name: str | None = None
    model_dtype: str | None = None
    batch_size: Any = None
    device: str | None = None
    chat_template_sha: str | None = None
    transformers_version: str | None = None
    date: float | None = None
    suite_hash: str | None = None
    manifest: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunResults:
    """Everything the gate knows about one evaluation run (or one stored baseline).

    series:   per (task, filter, metric) per-item values, leaf tasks only.
    groups:   lm-eval group aggregates as written in results.json:
              {group: {"acc,none": 0.646, ...}}; informational, never tested.
    group_subtasks: {group: [subtask, ...]}.
    snippets: {(task, filter): {doc_id: ItemSnippet}} from samples files; empty for baselines.
    notes:    human-readable remarks made while loading ("3 runs in DIR, took the newest: ...").
    untestable: {(task, filter, metric): aggregation name} for metrics the run reported but
              gatekeeper cannot test (unknown aggregation); a suite that gates one is an error.
    sample_lines: {(task, filter): (doc_ids, byte offsets)}: where each item's line starts in
              the task's samples file (lm-eval runs only), so snippets are read by seeking.
    choice_margins: {task: (doc_ids, margins)}: each multiple-choice item's acc margin (the gold
              choice's log-likelihood less the best other's; NaN where the line gives none), for
              tasks with at least one (results/informative.py); a baseline file keeps them.
    """

    provenance: Provenance
    series: dict[SeriesKey, MetricSeries]
    groups: dict[str, dict[str, float]] = field(default_factory=dict)
    group_subtasks: dict[str, list[str]] = field(default_factory=dict)
    snippets: dict[tuple[str, str], dict[int, ItemSnippet]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    untestable: dict[SeriesKey, str] = field(default_factory=dict)
    sample_lines: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    choice_margins: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def tasks(self) -> list[str]:
        return sorted({k.task for k in self.series})

    def parents(self, task: str) -> tuple[str, ...]:
        """The groups ``task`` belongs to, nearest first, then theirs (a policy rule for a group
        applies to its subtasks and nested groups)."""
        return ancestors(self.group_subtasks, task)


def ancestors(group_subtasks: dict[str, list[str]], task: str) -> tuple[str, ...]:
    """The groups that hold ``task``, nearest first, then the groups that hold those."""
    out: list[str] = []
    level = [task]
    while level:
        level = sorted({g for g, subs in group_subtasks.items() for t in level if t in subs} - {task, *out})
        out.extend(level)
    return tuple(out)


def is_int(v: Any) -> bool:
    """A JSON integer (``True`` is an int to Python, not to a file format)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_finite(v: Any) -> bool:
    """A finite JSON number (not a bool); integers beyond float range are not."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


@dataclass
class TrendRow:
    """One gated metric in a history entry (``baseline/trend.py``): the candidate's aggregate,
    what it was compared with, and the verdicts. Numbers are None where not measured."""

    key: str  # "task/filter/metric", as SeriesKey prints
    value: float | None
    baseline: float | None = None
    anchor: float | None = None  # None: the baseline was its own anchor
    lo: float | None = None  # the delta interval against the baseline
    hi: float | None = None
    margin: float = 0.0
    higher_is_better: bool = True
    verdict: str = ""  # against the baseline
    anchor_verdict: str = ""  # against the anchor ("" when the baseline is its own anchor)


@dataclass
class TrendEntry:
    """One gate, promote or pin in a suite's history, with a row per gated metric."""

    date: str  # ISO 8601, UTC
    event: str  # "gate" | "promote" | "pin"
    verdict: str  # the suite's: pass | fail | drift | promoted | pinned
    commit: str | None = None
    model: str | None = None
    baseline_id: str | None = None  # file ids (sha256 prefix) of the baseline and the anchor
    anchor_id: str | None = None
    anchor_date: str | None = None
    who: str | None = None  # pin: who moved the anchor and why
    why: str | None = None
    rows: list[TrendRow] = field(default_factory=list)
