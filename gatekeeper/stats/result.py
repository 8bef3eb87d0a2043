"""The result object of a paired comparison (shaped like scipy.stats result objects)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PairedTest:
    """One paired comparison of a candidate run against a baseline run on the same items.

    ``delta = candidate - baseline`` in the metric's own units. ``p_worse`` / ``p_better`` are
    one-sided p-values for "candidate is worse" / "candidate is better", already oriented by
    ``higher_is_better``. ``n_resamples`` is the number of random resamples behind the result
    (Monte Carlo permutations and/or bootstrap draws); 0 when everything is exact/closed form.
    """

    test: str
    n: int
    n_clusters: int | None
    baseline: float
    candidate: float
    delta: float
    ci_low: float
    ci_high: float
    confidence: float
    p_worse: float
    p_better: float
    se: float
    n_resamples: int
    warnings: tuple[str, ...] = ()

    def confidence_interval(self) -> tuple[float, float]:
        return (self.ci_low, self.ci_high)
