"""The machine-readable report (schema: docs/report-schema.md): strict JSON, no NaN."""

from __future__ import annotations

import math
from typing import Any

from gatekeeper import __version__
from gatekeeper.compare.outcome import Comparison, Outcome
from gatekeeper.model import Provenance
from gatekeeper.report.headline import anchor_date
from gatekeeper.report.numbers import finite

# 2: comparisons include the groups' own rows (kind, subtasks, weight_by_size), and every gated
# row, group or task, is one family under the correction.
SCHEMA_VERSION = 2


def _provenance_json(p: Provenance) -> dict[str, Any]:
    return {
        "source": p.source,
        "model": p.model_name,
        "dtype": p.model_dtype,
        "batch_size": p.batch_size,
        "device": p.device,
        "lm_eval_version": p.lm_eval_version,
        "transformers_version": p.transformers_version,
        "task_versions": p.task_versions,
        "n_shot": p.n_shot,
        "seeds": p.seeds,
        "limit": p.limit,
        "task_hashes": p.task_hashes,
        "chat_template_sha": p.chat_template_sha,
        "suite_hash": p.suite_hash,
        "date": p.date,
        "manifest": p.manifest,
    }


def comparison_json(c: Comparison) -> dict[str, Any]:
    t = c.test
    lo, hi = c.interval
    return {
        "task": c.key.task,
        "metric": c.key.metric,
        "filter": c.key.filter,
        "kind": "group" if c.is_group else "task",
        "subtasks": list(c.subtasks),
        "weight_by_size": c.weight_by_size,
        "gated": c.gated,
        "higher_is_better": c.higher_is_better,
        "margin": c.margin,
        "n": t.n,
        "n_clusters": t.n_clusters,
        "baseline": finite(t.baseline),
        "candidate": finite(t.candidate),
        "delta": finite(t.delta),
        "ci_low": finite(t.ci_low),
        "ci_high": finite(t.ci_high),
        "confidence": t.confidence,
        "decision_level": c.level,
        "decision_ci_low": finite(lo),
        "decision_ci_high": finite(hi),
        "decision_confidence": 1 - 2 * c.level,
        "p_value": finite(c.p_value if c.p_value is not None else t.p_worse),
        "p_adjusted": finite(c.p_adjusted),
        "alpha_share": c.share if c.gated else None,
        "test": t.test,
        "n_resamples": t.n_resamples,
        "verdict": c.verdict,
        "mde": finite(c.mde),
        "identical": t.identical,
        "rounded_items": c.rounded,
        "within_rounding": c.within_rounding,
        "right_to_wrong": c.right_to_wrong,
    }


def _strict(value: Any) -> Any:
    """``value`` with every non-finite float (anywhere: groups, margins, manifests) as None, so
    the report is strict JSON whoever serialises it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def error_json(message: str, *, suite: str | None, verdict: str = "error", **provenance: Any) -> dict[str, Any]:
    """The report of a gate that ended in exit 2 (nothing compared): why, and what it was asked to
    gate, so the artifact and the job summary say so too."""
    return _strict({"schema_version": SCHEMA_VERSION, "gatekeeper_version": __version__, "suite": suite,
                    "verdict": verdict, "error": message, "comparisons": [],
                    "provenance": {k: v for k, v in provenance.items() if v is not None}})


def to_json(outcome: Outcome) -> dict[str, Any]:
    """The machine-readable report; its schema is documented in docs/report-schema.md."""
    return _strict(_report_dict(outcome))


def _report_dict(outcome: Outcome) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "gatekeeper_version": __version__,
        "suite": outcome.suite,
        "verdict": outcome.verdict,
        "regressions": len(outcome.regressions),
        "inconclusive": len(outcome.inconclusive),
        "worse_within_margin": len(outcome.worse),
        "drifted": len(outcome.drifted),
        # The candidate against the anchor (the reference a person approved), in the same family;
        # null when the baseline is its own anchor.
        "anchor": None if outcome.anchor is None else {
            "date": anchor_date(outcome),
            "provenance": _provenance_json(outcome.anchor.provenance),
            "comparisons": [comparison_json(c) for c in outcome.anchor_comparisons],
        },
        "policy": {
            "alpha": outcome.policy.alpha,
            "correction": outcome.policy.correction,
            "group_share": outcome.policy.group_share,
            "design": outcome.design,
            "default_margin": outcome.policy.margin,
            "resamples": outcome.policy.resamples,
            "rounding": outcome.policy.rounding,
            "test": outcome.policy.test,
        },
        "comparisons": [comparison_json(c) for c in outcome.comparisons],
        "groups": {
            g: {"baseline": outcome.baseline.groups.get(g, {}), "candidate": vals}
            for g, vals in outcome.candidate.groups.items()
        },
        "provenance": {
            "baseline": _provenance_json(outcome.baseline.provenance),
            "candidate": _provenance_json(outcome.candidate.provenance),
            "differences": [d.message for d in outcome.differences],
        },
        "warnings": list(outcome.warnings),
        "notes": list(outcome.notes),
    }
