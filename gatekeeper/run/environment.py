"""The environment lm-eval and task code run in: no CI credential reaches them.

A GitHub token (the action's ``github-token`` input, ``GITHUB_TOKEN``) and the runner's own
tokens (``ACTIONS_*``) are never needed to evaluate a model, so they are removed from the
process environment before lm-eval starts. An API key is kept only for a backend that sends it
(the served endpoints, to the suite's ``base_url``), never for a model run in this process. The
MLflow credentials (``TRACKING_SECRETS``) are logged with after the evaluation, never during it:
they are out while lm-eval runs. Everything else in the step's environment stays (``HF_TOKEN`` for
gated hub models and datasets, the user's own settings): docs/action.md's trust table lists it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager

CI_SECRETS = (
    "INPUT_GITHUB-TOKEN", "INPUT_GITHUB_TOKEN", "GITHUB_TOKEN", "GH_TOKEN",
    "ACTIONS_RUNTIME_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_URL",
    "ACTIONS_RUNTIME_URL", "ACTIONS_CACHE_URL", "ACTIONS_RESULTS_URL",
)
# MLflow's credentials (mlflow.environment_variables): needed only after the evaluation.
TRACKING_SECRETS = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_USERNAME",
                    "MLFLOW_TRACKING_CLIENT_CERT_PATH", "DATABRICKS_TOKEN", "DATABRICKS_CLIENT_SECRET")
# The keys lm-eval's API backends read (openai_completions.py): sent only by those backends.
API_KEYS = ("OPENAI_API_KEY", "AZURE_OPENAI_API_KEY", "ANTHROPIC_API_KEY")
SENDS_API_KEY = ("local-completions", "local-chat-completions", "openai-completions", "openai-chat-completions",
                 "azure-openai-chat-completions", "anthropic-completions", "anthropic-chat-completions")


def scrub_ci_secrets(env: MutableMapping[str, str]) -> list[str]:
    """Remove the CI credentials from ``env`` (for good); returns the names removed."""
    return [name for name in CI_SECRETS if env.pop(name, None) is not None]


@contextmanager
def evaluation_env(backend: str) -> Iterator[None]:
    """While lm-eval runs: CI and MLflow credentials out, API keys out unless ``backend`` sends one;
    restored afterwards (a CLI user's shell keeps them)."""
    drop = list(CI_SECRETS) + list(TRACKING_SECRETS) + ([] if backend in SENDS_API_KEY else list(API_KEYS))
    saved = {name: os.environ.pop(name) for name in drop if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)
