"""lm-eval's warnings in a CI log (issue #41): a gate on MMLU at 5 shots printed ~900 lines of
"Combined length of context ...". Each kind of warning is shown once, counted, and summed up in
one line (with its tasks where lm-eval named them); the whole text goes to the run folder."""

from __future__ import annotations

import logging
import time

from gatekeeper.run.quiet import Warnings, quiet_output


def test_a_repeated_warning_is_shown_once_and_counted() -> None:
    lines: list[str] = []
    warned = Warnings()
    hf = logging.getLogger("lm_eval.models.huggingface")  # where lm-eval gives it, below "lm_eval"
    build = logging.getLogger("lm_eval.api.task")
    with quiet_output(lines.append, time.perf_counter(), warned):
        for task in ("mmlu_anatomy", "mmlu_virology"):
            build.info(f"Building contexts for {task} on rank 0...")
            build.warning(f"[Task: {task}] metric acc is defined, but aggregation is not. using default")
        build.info("Running generate_until requests")
        for i in range(900):
            hf.warning(f"Combined length of context ({1900 + i}) and max_gen_toks (256) exceeds model's "
                       "maximum length (2048). Truncating 108 tokens from the left.")
    shown = [ln for ln in lines if "lm-eval warning" in ln]
    assert len(shown) == 3, lines  # each kind once (the two task warnings differ in their text)
    assert sum("Combined length" in ln for ln in shown) == 1
    # the run's log ends with one line per repeated kind (runner.run_suite prints the summary)
    assert warned.summary() == ["lm-eval warning given 900 times: Combined length of context (N) and max_gen_toks "
                                "(N) exceeds model's maximum length (N). Truncating N tokens from the left."]
    assert len(warned.lines) == 902 and warned.text().count("\n") == 902
    assert "(1900)" in warned.text() and "(2799)" in warned.text()  # the full text keeps the numbers


def test_warnings_named_per_task_are_counted_per_task() -> None:
    lines: list[str] = []
    warned = Warnings()
    log = logging.getLogger("lm_eval.api.task")
    with quiet_output(lines.append, time.perf_counter(), warned):
        for task, n in (("arc_easy", 3), ("arc_challenge", 2)):
            log.info(f"Building contexts for {task} on rank 0...")
            for _ in range(n):
                log.warning("a document has no target; scoring it as empty")
    assert warned.summary() == ["lm-eval warning given 5 times (arc_challenge: 2, arc_easy: 3): "
                                "a document has no target; scoring it as empty"]
    assert sum("a document has no target" in ln for ln in lines) == 1
