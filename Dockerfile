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

# The heavy, pinned evaluation stack first, in a layer that depends on nothing but this line:
# editing gatekeeper's source or pyproject.toml must not reinstall torch and lm-eval.
# PyPI's Linux torch wheel bundles the CUDA runtime, so the runner host only needs the driver.
RUN pip install --no-cache-dir "torch==2.13.0" "lm-eval[hf]==0.4.13"

# git: on pull requests the action reads the baseline and the policy at the PR's base commit
# (gatekeeper/gitbase.py). Debian's git is security-patched in place, so it is not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends git \
 && rm -rf /var/lib/apt/lists/*

COPY pyproject.toml README.md /tmp/gatekeeper-src/
COPY gatekeeper /tmp/gatekeeper-src/gatekeeper
RUN pip install --no-cache-dir /tmp/gatekeeper-src \
 && rm -rf /tmp/gatekeeper-src \
 && pip check \
 && python -c "import gatekeeper.action"

ENTRYPOINT ["python", "-m", "gatekeeper.action"]
