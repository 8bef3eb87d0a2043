"""The measured figures README.md (and the docs pages in ``PAGES``) quote, recorded by the
benchmark that measured them.

Every timing in those pages sits between ``<!-- fig:ID -->`` and ``<!-- /fig -->``; the text there is
``figures.json[ID]["text"]``, written by the benchmark script named in the record when it runs
with ``--record`` (with the machine it ran on and the date). ``scripts/update_readme.py``
rewrites those spans from figures.json, and tests/test_readme_figures.py fails when README says
a timing that no benchmark recorded. Run a benchmark with ``--record`` and then
``python scripts/update_readme.py --figures-only`` to refresh the numbers.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

FIGURES = Path(__file__).resolve().parent / "figures.json"
SPAN = re.compile(r"<!-- fig:([a-z0-9_]+) -->(.*?)<!-- /fig -->", re.S)
_ROOT = FIGURES.parent.parent
# The pages whose timings are all recorded figures: the README and the pages it was split into.
PAGES = tuple(_ROOT / p for p in ("README.md", "docs/statistics.md", "docs/metrics.md", "docs/cli.md",
                                   "docs/baselines.md", "docs/scaling.md", "docs/development.md"))


def machine() -> str:
    """'2 CPU cores (Intel Xeon ...), load 0.3, Linux x86_64': what the figure was measured on."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = f", load {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    what = f" ({model})" if model else ""
    return f"{cores} CPU cores{what}{load}, {platform.system()} {platform.machine()}"


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def load() -> dict[str, Any]:
    return json.loads(FIGURES.read_text(encoding="utf-8")) if FIGURES.exists() else {}


def record(script: str, found: dict[str, tuple[str, float]], note: str = "") -> None:
    """Merge ``{id: (text, value)}`` measured by ``script`` into figures.json (atomically)."""
    data = load()
    stamp = {"script": script, "machine": machine(), "date": datetime.date.today().isoformat()}
    for fid, (text, value) in found.items():
        data[fid] = {"text": text, "value": round(value, 4), **stamp, **({"note": note} if note else {})}
    tmp = FIGURES.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, FIGURES)
    for fid, (text, _) in found.items():
        print(f"recorded {fid}: {text}")


def seconds(value: float) -> str:
    """How README writes a duration: '6.6 s', '19 s', '2.1 min'."""
    if value < 10:
        return f"{value:.1f} s"
    if value < 120:
        return f"{value:.0f} s"
    return f"{value / 60:.1f} min"


def render(text: str, data: dict[str, Any]) -> str:
    """``text`` with every figure span holding its recorded text (KeyError: an unknown id)."""
    return SPAN.sub(lambda m: f"<!-- fig:{m.group(1)} -->{data[m.group(1)]['text']}<!-- /fig -->", text)
