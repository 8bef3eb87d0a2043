"""What the run ran on, for the manifest: CPU model, GPU name, driver and CUDA versions.

Best effort and never fatal: a field that cannot be read is None. torch is imported lazily and
only when it is already installed (the gate itself runs without it).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def gpu_info() -> dict[str, Any]:
    """{gpu, gpu_count, cuda, driver}; all None on a machine without CUDA."""
    info: dict[str, Any] = {"gpu": None, "gpu_count": 0, "cuda": None, "driver": None}
    if importlib.util.find_spec("torch") is None:
        return info
    import torch

    if not torch.cuda.is_available():
        return info
    info["gpu_count"] = torch.cuda.device_count()
    info["gpu"] = torch.cuda.get_device_name(0)
    info["cuda"] = torch.version.cuda
    info["driver"] = _driver_version()
    return info


def _driver_version() -> str | None:
    # torch does not expose the driver version; nvidia-smi does, when present.
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.stdout.strip().splitlines()
    return first[0].strip() if out.returncode == 0 and first else None


def describe() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **gpu_info(),
    }
