"""Stage: run. lm-eval execution: the pinned suite through lm-eval 0.4.13's Python API.

- ``runner``: ``gatekeeper run`` (pre-flight checks, evaluation, manifest, request cache);
- ``backends``: hf, vllm, served endpoints; ``shard`` / ``merge``: N shards and their join;
- ``progress``, ``hardware``, ``packages``: progress lines and provenance for the manifest.

May import: the ground floor, ``results`` and ``suite``. torch and lm-eval are imported
lazily, inside the functions that evaluate, so the gate runs without them.
"""
