"""gatekeeper/run/once.py: what lm-eval redoes on every evaluation, done once, with lm-eval's own
results (issue #28)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

import jinja2  # noqa: E402
import lm_eval.evaluator as evaluator  # noqa: E402
from lm_eval import utils  # noqa: E402

from gatekeeper.run import once  # noqa: E402

TEMPLATES = [
    ("Question: {{question}}\nAnswer:", {"question": "2+2?"}),
    ("{{choices[label]}}", {"choices": ["a", "b"], "label": 1}),
    ("{{ text | regex_replace(' +', ' ') }}", {"text": "a  b   c"}),  # lm-eval's own filter
    ("{{ [a, b] }}", {"a": "x", "b": "y"}),
]


def test_templates_render_as_lm_evals_own_and_compile_once() -> None:
    own = [utils.apply_template(t, doc) for t, doc in TEMPLATES]
    with once.once_per_process():
        assert utils.apply_template.__module__ == "gatekeeper.run.once"
        first = [utils.apply_template(t, doc) for t, doc in TEMPLATES]
        again = [utils.apply_template(t, doc) for t, doc in TEMPLATES]
        with pytest.raises(jinja2.exceptions.UndefinedError):  # lm-eval's StrictUndefined, as before
            utils.apply_template("{{missing}}", {})
        with pytest.raises(jinja2.exceptions.TemplateSyntaxError):
            utils.apply_template("{{ unclosed", {})
    assert first == again == own
    assert utils.apply_template.__module__ == "lm_eval.utils"  # put back


def test_the_environment_report_is_lm_evals_and_made_once_per_folder(tmp_path: Path) -> None:
    own: dict = {}
    evaluator.add_env_info(own)
    once._ENV_INFO.clear()
    before = os.getcwd()
    with once.once_per_process():
        first: dict = {}
        evaluator.add_env_info(first)
        first["pretty_env_info"] += "changed by the caller"  # a copy: the next report is untouched
        second: dict = {}
        evaluator.add_env_info(second)
        os.chdir(tmp_path)  # the report names the git commit of the folder above the working one
        try:
            elsewhere: dict = {}
            evaluator.add_env_info(elsewhere)
        finally:
            os.chdir(before)
    assert second == own and set(first) == set(own)
    assert set(once._ENV_INFO) == {os.path.dirname(before), os.path.dirname(tmp_path)}
    assert elsewhere["upper_git_hash"] is None and elsewhere["pretty_env_info"] == own["pretty_env_info"]
    assert evaluator.add_env_info.__module__ == "lm_eval.loggers.utils"  # put back
