# The job container for GPU set-up 2 (docs/action-gpu.md): the job runs in this image, started
# with `--gpus all`, and calls the `gatekeeper` CLI. It is the action's own image (same Python,
# same hash-locked torch/lm-eval/transformers stack from requirements/runtime.txt, git included),
# so a run made here and a run made by the action compare with no version differences; only the
# entrypoint differs. .github/workflows/release.yml builds it right after the action's image and
# passes that image's digest as BASE.
ARG BASE=ghcr.io/your-org/gatekeeper:0.1.0
FROM ${BASE}

# A persistent Hugging Face cache: mount a runner-host folder here (`container.volumes:` in the
# workflow), so hub models and datasets are downloaded once per runner, not once per job.
ENV HF_HOME=/cache/huggingface

# The Actions runner replaces the entrypoint of a job container (it keeps it alive with
# `tail -f /dev/null` and runs the steps through `docker exec`); for `docker run` by hand, a shell.
ENTRYPOINT []
CMD ["bash"]
