"""Pure, vectorized paired statistics for the gate: no I/O, no torch, no lm-eval.

sacrebleu is imported lazily, only for corpus metrics (bleu, chrf, ter); scipy lazily, only
for McNemar.
"""

from gatekeeper.compare.stats.aggregate import aggregate
from gatekeeper.compare.stats.multiplicity import (
    Graph,
    adjust_pvalues,
    decision_levels,
    graph_adjusted,
    graph_levels,
    mde,
    mde_for_rule,
)
from gatekeeper.compare.stats.paired import (
    PendingStudentized,
    PendingTest,
    paired_test,
    pending_draws,
    plan_test,
)
from gatekeeper.compare.stats.result import PairedTest
from gatekeeper.compare.stats.rounding import aggregate_within_floor, snap_rounding, within_floor

__all__ = [
    "Graph", "PairedTest", "PendingStudentized", "PendingTest", "adjust_pvalues", "graph_adjusted", "graph_levels", "aggregate", "aggregate_within_floor", "decision_levels", "mde", "mde_for_rule", "paired_test",
    "pending_draws", "plan_test", "snap_rounding", "within_floor",
]
