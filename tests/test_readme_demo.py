"""README.md's demo output is what the code prints (regenerate: `python scripts/update_readme.py`).

The check renders `gatekeeper compare` of the stored baseline with the stored regressed run
(tests/fixtures/demo-regressed-run/, real lm-eval output), so it costs no evaluation and gives the
same bytes on any CPU; a second test ties that stored run to what the regressed checkpoint gives
on this machine (the session's demo run), within the tolerance CPUs differ by.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from tests.demo_runs import ROOT, assert_same_items, compare_cli

FIX = "run `python scripts/update_readme.py` (it gates the regressed demo and rewrites both README blocks)"


def _script():
    """scripts/update_readme.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "scripts" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass needs its module registered
    spec.loader.exec_module(module)
    return module


def test_readme_demo_blocks_are_what_the_code_prints():
    script = _script()
    readme = script.README.read_text(encoding="utf-8")
    out = script.demo_output(script.RUN_FIXTURE)
    assert out.exit_code == 1 and out.terminal.endswith("FAIL: gatekeeper demo: 2 regressions: demo_mc acc -0.2024, demo_capitals_mc acc -0.4300")
    assert out.markdown.startswith("### ❌ gatekeeper demo: 2 regressions")
    expected = script.render_readme(readme, out)
    assert readme == expected, f"README.md's demo output is stale: {FIX}"
    page = script.REPORT_PAGE.read_text(encoding="utf-8")
    assert page == script.render_report_page(page, out), f"docs/report.md's demo report is stale: {FIX}"
    # the blocks hold the output whole, not an excerpt
    assert f"```\n{out.terminal}\n```" in readme and f"```markdown\n{out.markdown}\n```" in page


def test_check_mode_names_the_fix_when_readme_drifts(tmp_path, monkeypatch, capsys):
    script = _script()
    stale = tmp_path / "README.md"
    text = script.README.read_text(encoding="utf-8").replace("REGRESSED", "regressed", 1)
    stale.write_text(text, encoding="utf-8")
    monkeypatch.setattr(script, "README", stale)
    assert script.main(["--check"]) == 1
    assert "run `python scripts/update_readme.py`" in capsys.readouterr().err
    assert stale.read_text(encoding="utf-8") == text  # --check writes nothing


def test_missing_markers_are_an_error_naming_readme(tmp_path):
    script = _script()
    with pytest.raises(SystemExit, match="README.md: expected exactly one `<!-- demo-output:terminal -->`"):
        script.render_readme("# no markers\n", script.DemoOutput("t", "m", 1))


@pytest.mark.lmeval
def test_stored_readme_run_is_what_the_regressed_checkpoint_gives_here(demo_gate, tmp_path):
    from gatekeeper.results import reader as results

    script = _script()
    fresh = demo_gate("regressed")
    try:
        assert_same_items(results.load_run(script.RUN_FIXTURE), results.load_run(fresh.run_dir))
    except AssertionError as err:
        raise AssertionError(f"tests/fixtures/demo-regressed-run differs from a fresh run: {FIX}\n{err}") from err
    # and the gated verdicts README shows are the ones the gate gives here
    proc = compare_cli(script.BASELINE, script.RUN_FIXTURE, "--json", str(tmp_path / "r.json"))
    shown = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == fresh.exit_code == 1

    def gated(report: dict) -> set:
        return {(c["task"], c["filter"], c["metric"], c["verdict"]) for c in report["comparisons"] if c["gated"]}

    assert gated(shown) == gated(fresh.report), FIX
