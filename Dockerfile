# gatekeeper as a Docker container action (action.yml: runs.using docker, image Dockerfile).
# GitHub runs it as root with --workdir /github/workspace and its own mounts, so there is no
# USER and no WORKDIR here (both are against GitHub's rules for Docker actions).
FROM python:3.11-slim

# PYTHONSAFEPATH: `python -m gatekeeper.action` runs with the checked-out repo as its working
# directory; without it a `gatekeeper/` folder in that repo would shadow the installed package.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONSAFEPATH=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TQDM_MININTERVAL=30 \
    HF_HUB_DISABLE_TELEMETRY=1

# The heavy, pinned evaluation stack first, in layers that depend on nothing but these lines and
# the lockfile: editing gatekeeper's source or pyproject.toml must not reinstall torch and lm-eval.
# PyPI's Linux torch wheel bundles the CUDA runtime, so the runner host only needs the driver;
# torch pins those CUDA libraries (nvidia-*, triton) exactly itself.
RUN pip install --no-cache-dir "torch==2.13.0"

# Everything else the evaluation runs on (lm-eval, transformers, tokenizers, datasets, accelerate,
# numpy, scipy, ...) at the exact versions and file hashes of requirements/runtime.txt, compiled
# from pyproject.toml by requirements/compile.sh: results change when these change. --no-deps:
# nothing outside the lock gets in; `pip check` below proves the lock is complete.
COPY requirements/runtime.txt /tmp/requirements-runtime.txt
RUN pip install --no-cache-dir --no-deps --require-hashes -r /tmp/requirements-runtime.txt \
 && rm /tmp/requirements-runtime.txt

# git: on pull requests the action reads the baseline and the policy at the PR's base commit
# (gatekeeper/baseline/gitbase.py); git-lfs: the trusted fork gate reads a PR head's checkpoint
# from git objects (model-commit), whose weights are LFS objects. Debian's git is security-patched in place, so it is not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends git git-lfs \
 && rm -rf /var/lib/apt/lists/*

COPY pyproject.toml README.md /tmp/gatekeeper-src/
COPY gatekeeper /tmp/gatekeeper-src/gatekeeper
RUN pip install --no-cache-dir --no-deps /tmp/gatekeeper-src \
 && rm -rf /tmp/gatekeeper-src \
 && pip check \
 && python -c "import gatekeeper.action"

ENTRYPOINT ["python", "-m", "gatekeeper.action"]
