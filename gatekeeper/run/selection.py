"""Which documents a run evaluates when it is not the whole suite: a shard, a look, a limit.

lm-eval takes one global ``limit`` or per-task ``samples`` (document indices). ``limits`` turns
the suite's per-task limits into those; ``shard_manifest`` and ``look_manifest`` say which
documents shard K/N or look K of a sequential gate evaluates, with what ``gatekeeper merge`` and
``run --complete`` need to rebuild the whole run, and replay the few-shot draws so every prompt
equals the whole run's (``_replay_fewshot``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gatekeeper.errors import GateError
from gatekeeper.run import looks
from gatekeeper.run.looks import Look
from gatekeeper.run.shard import Shard, selection
from gatekeeper.run.tasks import group_aggregations


def limits(leaves: dict, cli_limit: Any, get_sample_size: Callable) -> tuple[Any, dict | None]:
    """lm-eval has one global ``limit``; per-task limits go through ``samples`` (first N docs)."""
    if cli_limit is not None:
        return cli_limit, None
    per_task = {name: spec.limit for name, (_, spec) in leaves.items()}
    distinct = set(per_task.values())
    if len(distinct) == 1:
        return distinct.pop(), None
    samples = {}
    for name, lim in per_task.items():
        if lim is None:
            continue
        task = leaves[name][0]
        n = min(get_sample_size(task, lim), len(task.eval_docs))
        samples[name] = list(range(n))
    return None, samples


def shard_manifest(shard: Shard, top: list, leaves: dict, cli_limit: Any) -> dict[str, Any]:
    """Which documents shard K/N evaluates, and what ``gatekeeper merge`` needs to rebuild the
    whole run: the per-task item counts, the ``limit`` the unsharded run would hand lm-eval, and
    each group's aggregation (results.json does not record it). Also makes few-shot prompts
    identical to the unsharded run's (``_replay_fewshot``)."""
    from lm_eval.evaluator_utils import get_sample_size

    sizes = {}
    for name, (task, spec) in leaves.items():
        original = len(task.eval_docs)
        lim = cli_limit if cli_limit is not None else spec.limit
        sizes[name] = original if lim is None else min(get_sample_size(task, lim), original)
    ranges = selection(sizes, shard)
    for name, (first, end) in ranges.items():
        _replay_fewshot(leaves[name][0], range(first, end))
    return {
        "index": shard.index,
        "count": shard.count,
        "docs": {name: list(r) for name, r in sorted(ranges.items())},
        "items": dict(sorted(sizes.items())),
        "limit": limits(leaves, cli_limit, get_sample_size)[0],
        "groups": group_aggregations(top),
    }


def look_manifest(look: Look, top: list, leaves: dict, cli_limit: Any) -> dict[str, Any]:
    """Which documents look K of a sequential gate evaluates (``run/looks.py``), with few-shot
    prompts made identical to a whole run's (``_replay_fewshot``). ``samples`` (lm-eval's
    argument) is popped by the caller; ``docs`` (the new documents per task) stays in the manifest,
    with what ``run --complete`` needs to join the looks into the whole run (as a shard's)."""
    from lm_eval.evaluator_utils import get_sample_size

    sizes = {}
    for name, (task, spec) in leaves.items():
        original = len(task.eval_docs)
        lim = cli_limit if cli_limit is not None else spec.limit
        sizes[name] = original if lim is None else min(get_sample_size(task, lim), original)
    lm_samples, new = looks.samples(sizes, look)
    for name, docs in lm_samples.items():
        _replay_fewshot(leaves[name][0], docs)
    unknown = sorted(look.done - set(sizes))
    if unknown:
        raise GateError(f"--done {','.join(unknown)}: not a task of this suite (tasks: {', '.join(sorted(sizes))})")
    return {"index": look.index, "count": look.count, "seed": look.seed, "done": sorted(look.done),
            "part": list(look.part) if look.part else None, "rest": look.is_rest, "docs": new, "items": dict(sorted(sizes.items())),
            "limit": limits(leaves, cli_limit, get_sample_size)[0], "groups": group_aggregations(top),
            "samples": lm_samples}


def _replay_fewshot(task: Any, docs: Sequence[int]) -> None:
    """lm-eval draws few-shot examples from one seeded RNG, document after document, so the
    examples for document i depend on the documents before it. For a selection of documents (a
    shard's range, a look's sorted sample), the prompts of the unselected documents before each
    selected one are built (and thrown away) first, so its prompts, and their prompt_hash, equal
    a whole run's. lm-eval 0.4.13 builds one context per selected document, in order (a shard's
    range replays only before its first); a wrong replay changes the prompt hashes, which the
    comparison with the baseline refuses (fail closed)."""
    if not task.get_config("num_fewshot") or not docs:
        return
    real = task.fewshot_context
    calls = [0]

    def fewshot_context(doc: Any, *args: Any, **kwargs: Any) -> Any:
        j = calls[0]
        calls[0] += 1
        if j < len(docs):
            start = docs[j - 1] + 1 if j else 0
            all_docs = task.eval_docs
            for i in range(start, docs[j]):
                kw = dict(kwargs)
                if "gen_prefix" in kw:  # the prefix belongs to the document
                    kw["gen_prefix"] = task.doc_to_prefix(all_docs[i])
                real(all_docs[i], *args, **kw)
        return real(doc, *args, **kwargs)

    task.fewshot_context = fewshot_context


def shard_docs(picked: dict[str, Any]) -> dict[str, list[int]]:
    """lm-eval's ``samples`` argument for a shard: sorted document indices per task (lm-eval
    labels the i-th selected document with ``samples[task][i]``, so they must be sorted)."""
    return {name: IndexList(range(first, end)) for name, (first, end) in picked["docs"].items()}


class IndexList(list):
    """A list whose ``in`` is a set lookup: lm-eval 0.4.13 tests ``i in samples`` for every
    document of the task, which is quadratic on a plain list of 12k indices."""

    def __init__(self, items: Any) -> None:
        super().__init__(items)
        self._set = frozenset(self)

    def __contains__(self, item: object) -> bool:
        return item in self._set
