"""report: strict JSON, escaping of untrusted text, the markdown size cap."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np

from gatekeeper import report
from gatekeeper.compare import compare_runs
from gatekeeper.policy import Policy
from tests.synthetic import run, series

WJ = report.WORD_JOINER


def _outcome(*tasks: str, drop: int = 0, n: int = 200):
    base = np.zeros(n)
    base[: n // 2] = 1
    cand = base.copy()
    cand[:drop] = 0
    a = run(*(series(t, "acc", base) for t in tasks))
    b = run(*(series(t, "acc", cand) for t in tasks))
    return compare_runs(a, b, Policy(), suite="demo")


def test_to_json_is_strict_even_with_non_finite_group_values_and_margins():
    out = _outcome("t")
    out.baseline = replace(out.baseline, groups={"g": {"acc,none": float("nan")}})
    out.candidate = replace(out.candidate, groups={"g": {"acc,none": float("inf")}})
    out.comparisons[0].margin = float("nan")  # built by hand, bypassing Policy.validate
    data = report.to_json(out)
    text = json.dumps(data, allow_nan=False)  # raises on NaN/inf
    assert json.loads(text)["groups"] == {"g": {"baseline": {"acc,none": None}, "candidate": {"acc,none": None}}}
    assert data["comparisons"][0]["margin"] is None
