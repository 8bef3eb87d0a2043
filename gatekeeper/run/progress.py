"""Progress lines inside lm-eval's request phases, for logs that are not terminals.

lm-eval shows tqdm bars; in a GitHub Actions log every refresh is a new line, so ``runner``
hides them when stderr is not a TTY, and this module prints instead, per request phase
(loglikelihood, loglikelihood_rolling, generate_until)::

    [  42.0s] loglikelihood: 1200/4000 requests (30%), 28.6/s, ETA 1m38s

at most one line every ``GATEKEEPER_PROGRESS_SECONDS`` (default 30) seconds, plus one line when
the phase ends. Requests are counted where every lm-eval backend reports a finished request:
``cache_hook.add_partial`` (the hook lm-eval's request cache uses), so the count is the same for
hf, vLLM and served endpoints. The total is the number of requests the backend is handed, which
with ``--cache`` excludes the ones answered from the cache.

``Progress.spent`` keeps each phase's requests and seconds, the model's own time per request,
which the run's manifest records (``request_seconds``): a sequential gate's saving is computed
from it, not from wall time that includes building tasks and loading the model.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

ENV_INTERVAL = "GATEKEEPER_PROGRESS_SECONDS"
DEFAULT_INTERVAL = 30.0
PHASES = ("loglikelihood", "loglikelihood_rolling", "generate_until")

Log = Callable[[str], Any]


def interval_from_env() -> float:
    """Seconds between progress lines; an unreadable value falls back to the default."""
    try:
        value = float(os.environ.get(ENV_INTERVAL, DEFAULT_INTERVAL))
    except ValueError:
        return DEFAULT_INTERVAL
    return value if value >= 0 else DEFAULT_INTERVAL


class Progress:
    """Counts finished requests of one phase at a time; prints rate-limited lines."""

    def __init__(self, log: Log, t0: float, interval: float, clock: Callable[[], float] = time.perf_counter):
        self._log, self._t0, self._interval, self._clock = log, t0, interval, clock
        self.phase: str | None = None
        self.total = self.done = 0
        self._started = self._last = 0.0
        self.spent: dict[str, dict[str, float]] = {}  # phase -> {"requests": n, "seconds": s}

    def start(self, phase: str, total: int) -> None:
        self.phase, self.total, self.done = phase, total, 0
        self._started = self._last = self._clock()

    def step(self, phase: str, n: int = 1) -> None:
        if phase != self.phase:
            return  # e.g. the loglikelihood windows inside a loglikelihood_rolling phase
        self.done += n
        now = self._clock()
        if now - self._last >= self._interval and self.done < self.total:
            self._last = now
            self._emit(now)

    def finish(self, *, report: bool = True) -> None:
        now = self._clock()
        if self.phase is not None:
            phase = self.spent.setdefault(self.phase, {"requests": 0, "seconds": 0.0})
            phase["requests"] += self.total
            phase["seconds"] = round(phase["seconds"] + now - self._started, 3)
        if report and self.phase is not None and self.total:
            self._emit(now)
        self.phase = None

    def _emit(self, now: float) -> None:
        elapsed = max(now - self._started, 1e-9)
        rate = self.done / elapsed
        left = self.total - self.done
        eta = _duration(left / rate) if rate > 0 else "?"
        pct = 100.0 * self.done / self.total if self.total else 100.0
        tail = f"ETA {eta}" if left > 0 else f"done in {_duration(elapsed)}"
        self._log(f"[{now - self._t0:7.1f}s] {self.phase}: {self.done}/{self.total} requests "
                  f"({pct:.0f}%), {rate:.1f}/s, {tail}")


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@contextlib.contextmanager
def track(model_class: type, progress: Progress) -> Iterator[None]:
    """While inside: the request methods of ``model_class`` start and finish a phase, and
    lm-eval's ``CacheHook.add_partial`` counts finished requests. Restored on exit."""
    from lm_eval.api.model import CacheHook

    saved_hook = CacheHook.add_partial
    saved: dict[str, Any] = {name: model_class.__dict__.get(name) for name in PHASES}

    def add_partial(hook: Any, attr: str, req: Any, res: Any) -> None:
        saved_hook(hook, attr, req, res)
        progress.step(attr)

    def wrap(name: str) -> Callable:
        inner = getattr(model_class, name)

        def run(self: Any, requests: list, *args: Any, **kwargs: Any) -> Any:
            if progress.phase is not None:  # a phase calling another (nested): count the outer one
                return inner(self, requests, *args, **kwargs)
            progress.start(name, len(requests))
            try:
                out = inner(self, requests, *args, **kwargs)
            except BaseException:
                progress.finish(report=False)  # the error says what happened
                raise
            progress.finish()
            return out

        return run

    CacheHook.add_partial = add_partial  # type: ignore[method-assign]
    for name in PHASES:
        setattr(model_class, name, wrap(name))
    try:
        yield
    finally:
        CacheHook.add_partial = saved_hook  # type: ignore[method-assign]
        for name, original in saved.items():
            if original is None:
                delattr(model_class, name)
            else:
                setattr(model_class, name, original)
