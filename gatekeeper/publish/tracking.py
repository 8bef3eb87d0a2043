"""The team's tracking system: one MLflow run per gate.

``gatekeeper gate|compare ... --mlflow [URI]`` and the action's ``mlflow-tracking-uri`` input log
one run into the experiment ``gatekeeper/<suite>``:

- params: suite, suite hash, model, commit, lm-eval version, gatekeeper version, alpha,
  correction, test;
- metrics, per comparison (``<task>/<metric>,<filter>`` with MLflow's allowed characters):
  the candidate's aggregate, delta, adjusted p, MDE, and the delta since the anchor; ``step``
  is the night (days since 1970-01-01), so a nightly series lines up in MLflow's charts;
- tags: verdict, event, regressions, drifted;
- artifacts: the JSON report and the markdown.

MLflow is an optional extra (``gatekeeper-eval[mlflow]``: mlflow-skinny), imported only here and
only when asked. The default URI is a local ``mlruns/`` file store: offline, nothing to start.
A failure to log is a warning; it never changes the verdict or the exit code, and all logging of
one gate ends within one deadline (``GATEKEEPER_MLFLOW_DEADLINE`` seconds, default 60), after the
report and the outputs are written.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_URI = "mlruns"
DEADLINE_ENV = "GATEKEEPER_MLFLOW_DEADLINE"
DEFAULT_DEADLINE_S = 60.0
_NAME_SAFE = re.compile(r"[^A-Za-z0-9_\-. /]")  # MLflow's allowed characters in metric/param names


@dataclass
class Logged:
    ok: bool
    run_id: str | None = None
    uri: str = ""
    message: str = ""


def tracking_uri(value: str | None) -> str:
    """A URI MLflow accepts: a server (http/https), a database, or a local folder as ``file:``."""
    value = (value or DEFAULT_URI).strip()
    if re.match(r"^[a-z][a-z0-9+.-]*://", value) or value.startswith("file:"):
        return value
    return Path(os.path.abspath(value)).as_uri()


def log_gate(uri: str | None, report_json: dict[str, Any], markdown: str, *, event: str = "cli",
             commit: str | None = None, model: str | None = None) -> Logged:
    """Log one gate; never raises (a tracking problem must not change the verdict)."""
    target = tracking_uri(uri)
    try:
        import mlflow  # optional extra: gatekeeper-eval[mlflow]
    except ImportError:
        return Logged(False, uri=target, message="mlflow is not installed; pip install -e '.[mlflow]' "
                                                 "(mlflow-skinny) to log to a tracking system")
    if target.startswith("file:"):
        # MLflow 3 keeps its file store in maintenance mode and refuses it unless asked: the default
        # local store is gatekeeper's choice (offline, nothing to start), so it asks. A team's
        # tracking belongs on a server or a database URI.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    # MLflow retries a request 7 times with backoff (minutes against a dead server): a tracking
    # problem must not hold the gate that long. The user's own settings win.
    for name, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                        ("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")):
        os.environ.setdefault(name, value)
    limit = deadline()
    done: list[Logged] = []

    def work() -> None:
        try:
            done.append(_log(mlflow, target, report_json, markdown, event=event, commit=commit, model=model))
        except Exception as err:  # noqa: BLE001 - any tracking failure is a warning, never the verdict
            done.append(Logged(False, uri=_redact(target), message=f"could not log to MLflow at {_redact(target)}: "
                               f"{type(err).__name__}: {_redact(str(err))[:300]}"))

    # One deadline over every request: MLflow's per-request timeout does not bound a server that
    # trickles bytes. A daemon thread past the deadline is left behind; the process exits anyway.
    worker = threading.Thread(target=work, name="gatekeeper-mlflow", daemon=True)
    worker.start()
    worker.join(limit)
    if not done:
        return Logged(False, uri=_redact(target), message=f"gave up logging to MLflow at {_redact(target)} after "
                      f"{limit:g} s ({DEADLINE_ENV}); the verdict stands")
    return done[0]


def deadline() -> float:
    """Seconds all MLflow logging of one gate may take (``GATEKEEPER_MLFLOW_DEADLINE``, default 60)."""
    try:
        value = float(os.environ.get(DEADLINE_ENV) or DEFAULT_DEADLINE_S)
    except ValueError:
        return DEFAULT_DEADLINE_S
    return value if math.isfinite(value) and value > 0 else DEFAULT_DEADLINE_S


def _log(mlflow: Any, uri: str, report_json: dict[str, Any], markdown: str, *, event: str,
         commit: str | None, model: str | None) -> Logged:
    client = mlflow.MlflowClient(tracking_uri=uri)
    suite = str(report_json.get("suite") or "suite")
    name = f"gatekeeper/{suite}"
    exp = client.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
    cand = (report_json.get("provenance") or {}).get("candidate") or {}
    tags = {"verdict": str(report_json.get("verdict")), "event": event,
            "regressions": str(report_json.get("regressions", 0)), "drifted": str(report_json.get("drifted", 0)),
            "mlflow.runName": f"{suite} {report_json.get('verdict')} {time.strftime('%Y-%m-%d', time.gmtime())}"}
    run = client.create_run(exp_id, tags=tags)
    run_id = run.info.run_id
    status = "FAILED"
    try:
        policy = report_json.get("policy") or {}
        params = {"suite": suite, "suite_hash": cand.get("suite_hash"), "model": model or cand.get("model"),
                  "commit": commit, "lm_eval_version": cand.get("lm_eval_version"),
                  "gatekeeper_version": report_json.get("gatekeeper_version"), "alpha": policy.get("alpha"),
                  "correction": policy.get("correction"), "test": policy.get("test")}
        for key, value in params.items():
            if value is not None:
                client.log_param(run_id, key, str(value)[:500])
        now = int(time.time() * 1000)
        step = int(time.time() // 86400)  # the night
        for m in _metrics(report_json):
            client.log_metric(run_id, m[0], m[1], timestamp=now, step=step)
        with tempfile.TemporaryDirectory(prefix="gatekeeper-mlflow-") as tmp:
            (Path(tmp) / "report.json").write_text(json.dumps(report_json, indent=2, allow_nan=False) + "\n")
            (Path(tmp) / "report.md").write_text(markdown + "\n", encoding="utf-8")
            client.log_artifact(run_id, str(Path(tmp) / "report.json"))
            client.log_artifact(run_id, str(Path(tmp) / "report.md"))
        status = "FINISHED"
    finally:
        client.set_terminated(run_id, status=status)
    return Logged(True, run_id=run_id, uri=_redact(uri), message=f"logged MLflow run {run_id} to {_redact(uri)}")


def _metrics(report_json: dict[str, Any]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    anchor = {(c["task"], c["filter"], c["metric"]): c
              for c in ((report_json.get("anchor") or {}).get("comparisons") or [])}
    for c in report_json.get("comparisons") or []:
        name = metric_name(c["task"], c["metric"], c["filter"])
        values = {"value": c.get("candidate"), "delta": c.get("delta"), "p_adjusted": c.get("p_adjusted"),
                  "mde": c.get("mde")}
        a = anchor.get((c["task"], c["filter"], c["metric"]))
        if a is not None:
            values["delta_since_anchor"] = a.get("delta")
        for what, v in values.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out.append((f"{name}/{what}", float(v)))
    return out


def metric_name(task: str, metric: str, filt: str) -> str:
    """``task/metric,filter`` in MLflow's allowed characters (',' and others become '_')."""
    return _NAME_SAFE.sub("_", f"{task}/{metric}" + ("" if filt == "none" else f"_{filt}"))[:240]


def _redact(text: str) -> str:
    """A URI with its password (user:secret@host) hidden."""
    return re.sub(r"(//[^/:@\s]+:)[^@\s/]+@", r"\1***@", text)
