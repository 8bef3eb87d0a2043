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


def test_torchs_report_is_kept_on_disk_until_what_it_describes_can_change(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's part of the report (pip list, lscpu, nvidia-smi: 0.6 s an evaluation) is made
    once for a boot, an interpreter, its installed packages and the variables it reads; any
    change, or a damaged file, makes it again. No boot id: made every time, nothing kept."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    packages = tmp_path / "site-packages"
    packages.mkdir()
    monkeypatch.setattr(once.site, "getsitepackages", lambda: [str(packages)])
    made: list[str] = []

    def compute() -> str:
        made.append(f"report {len(made)}")
        return made[-1]

    assert once.kept_env_report(compute) == once.kept_env_report(compute) == "report 0"
    (kept,) = (tmp_path / "cache" / "gatekeeper").glob("env-report-*.json")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # another GPU in view
    assert once.kept_env_report(compute) == "report 1"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert once.kept_env_report(compute) == "report 0"  # that environment's, kept
    (packages / "newpkg-1.0.dist-info").mkdir()  # pip installed something
    os.utime(packages, ns=(0, 10**18))
    assert once.kept_env_report(compute) == "report 2"
    for damaged in ("{", '{"pretty_env_info": 3}', "[]"):
        for path in (tmp_path / "cache" / "gatekeeper").glob("env-report-*.json"):
            path.write_text(damaged)
        count = len(made)
        assert once.kept_env_report(compute) == made[-1] and len(made) == count + 1
        assert once.kept_env_report(compute) == made[-1] and len(made) == count + 1  # and kept again
    monkeypatch.setattr(once, "BOOT_ID", tmp_path / "no-boot-id")
    count = len(made)
    once.kept_env_report(compute)
    once.kept_env_report(compute)
    assert len(made) == count + 2
    assert kept.exists()
