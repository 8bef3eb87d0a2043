"""The package has the shape docs/architecture.md draws: one folder per stage, imports down only.

Read from the source with ``ast`` (nothing is imported): every ``import`` in ``gatekeeper/``
must go to its own stage, a stage below it or the ground floor; module-level imports between
gatekeeper modules form no circle; inside the stages no function imports another gatekeeper
module (only the front doors may, for start-up time), and the only function-level imports of
other packages are the heavy optional ones; no module imports another module's private name.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from gatekeeper.cli import build_parser

PACKAGE = Path(__file__).resolve().parents[1] / "gatekeeper"
GROUND = {"gatekeeper", "gatekeeper.model", "gatekeeper.errors", "gatekeeper.files", "gatekeeper.yamlsafe",
          "gatekeeper.text"}
FRONT = {"gatekeeper.cli", "gatekeeper.action", "gatekeeper.gate", "gatekeeper.__main__"}
# stage -> the stages it may import (besides itself and the ground floor)
ALLOWED = {
    "ground": set(),
    "results": set(),
    "suite": {"results"},
    "run": {"results", "suite"},
    "compare": {"results", "suite"},
    "baseline": {"results", "suite", "compare"},
    "report": {"compare"},
    "publish": set(),
    "front": {"results", "suite", "run", "compare", "baseline", "report", "publish"},
}
# Imported inside functions on purpose: slow to import, or optional (the gate runs without them).
HEAVY = {"torch", "lm_eval", "sacrebleu", "scipy", "jsonschema", "huggingface_hub", "transformers", "mlflow",
         "datasets"}


@dataclass(frozen=True)
class Import:
    importer: str
    target: str  # a module name (gatekeeper's own resolved to the module, else the top name)
    names: tuple[str, ...]
    line: int
    in_function: bool


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def stage(module: str) -> str:
    if module in GROUND:
        return "ground"
    if module in FRONT:
        return "front"
    return module.split(".")[1]


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = importer if MODULES[importer].name == "__init__.py" else importer.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imports_of(module: str) -> list[Import]:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    out: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    out.append(Import(module, alias.name, (), child.lineno, in_function))
            elif isinstance(child, ast.ImportFrom):
                base = _resolve(module, child)
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    target, names = (sub, ()) if sub in MODULES else (base, (alias.name,))
                    out.append(Import(module, target, names, child.lineno, in_function))
            visit(child, inner)

    visit(tree, False)
    return out


ALL = [imp for m in MODULES for imp in imports_of(m)]
OWN = [imp for imp in ALL if imp.target == "gatekeeper" or imp.target.startswith("gatekeeper.")]


def test_every_module_is_in_a_known_stage():
    unknown = sorted(m for m in MODULES if stage(m) not in ALLOWED)
    assert not unknown, f"modules outside the stages of docs/architecture.md: {unknown}"


def test_imports_go_down_the_stages_only():
    bad = []
    for imp in OWN:
        mine, theirs = stage(imp.importer), stage(imp.target)
        if theirs in ("ground", mine) or theirs in ALLOWED[mine]:
            continue
        bad.append(f"{imp.importer}:{imp.line} ({mine}) imports {imp.target} ({theirs})")
    assert not bad, "imports that go up or across a stage:\n" + "\n".join(bad)


def test_no_import_circle():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in OWN:
        if not imp.in_function and imp.target != imp.importer:
            graph[imp.importer].add(imp.target)
            # importing a.b.c runs the __init__ of a.b first (unless a.b is the importer's own
            # package, whose __init__ Python has already started before the importer runs)
            parts = imp.target.split(".")
            graph[imp.importer].update(
                pkg for pkg in (".".join(parts[:i]) for i in range(2, len(parts)))
                if pkg in MODULES and not imp.importer.startswith(pkg + "."))
    circles, state = [], {}

    def dfs(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if nxt == node or nxt not in graph:
                continue
            if state.get(nxt) == "open":
                circles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                dfs(nxt, [*path, nxt])
        state[node] = "done"

    for m in sorted(graph):
        if m not in state:
            dfs(m, [m])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_no_function_level_import_of_gatekeeper_inside_the_stages():
    bad = [f"{imp.importer}:{imp.line}: {imp.target}" for imp in OWN
           if imp.in_function and stage(imp.importer) != "front"]
    assert not bad, "function-level imports of gatekeeper modules (import at the top instead):\n" + "\n".join(bad)


def test_function_level_imports_are_heavy_optional_modules_only():
    bad = [f"{imp.importer}:{imp.line}: {imp.target}" for imp in ALL
           if imp.in_function and not imp.target.startswith("gatekeeper")
           and imp.target.split(".")[0] not in HEAVY]
    assert not bad, ("function-level imports of light modules (import them at the top; only "
                     f"{', '.join(sorted(HEAVY))} may wait):\n" + "\n".join(bad))


def _private_attribute_uses(module: str) -> list[str]:
    """``alias._name`` where ``alias`` is a gatekeeper module imported by this one."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            for a in node.names:
                if f"{base}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("gatekeeper") and a.asname:
                    aliases[a.asname] = a.name
    return [f"{module}:{node.lineno}: {aliases[node.value.id]}.{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
            and node.attr.startswith("_") and not node.attr.startswith("__") and aliases[node.value.id] != module]


def test_no_private_name_of_another_module_is_used():
    bad = [f"{imp.importer}:{imp.line}: {imp.target}.{name}" for imp in OWN for name in imp.names
           if name.startswith("_") and not name.startswith("__") and imp.target != imp.importer]
    bad += [use for m in MODULES for use in _private_attribute_uses(m)]
    assert not bad, "private names used from another module:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", sorted(m for m in MODULES if MODULES[m].name == "__init__.py" and m.count(".") == 1))
def test_each_stage_says_what_it_owns_and_may_import(package):
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text(encoding="utf-8"))) or ""
    assert doc.startswith("Stage: "), f"{package}/__init__.py: docstring should start with 'Stage: <name>.'"
    assert "May import" in doc, f"{package}/__init__.py: docstring should say what the stage may import"


def test_each_subcommand_is_built_beside_its_handler():
    # build_parser grew with every flag (137 lines); each subcommand now has its own builder,
    # defined right before the handler it sets, and build_parser only assembles them
    tree = ast.parse((PACKAGE / "cli.py").read_text(encoding="utf-8"))
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    names = [f.name for f in functions]
    build = functions[names.index("build_parser")]
    assert build.end_lineno - build.lineno < 12
    commands = build_parser()._subparsers._group_actions[0].choices
    for command in commands:
        builder = f"_{command}_parser"
        assert builder in names, f"no {builder} for {command!r}"
        assert names[names.index(builder) + 1] == f"cmd_{command}", f"{builder} is not beside cmd_{command}"
        size = functions[names.index(builder)]
        assert size.end_lineno - size.lineno < 60


def test_the_files_started_first_exist():
    """conftest's scheduling order names test files; one renamed would silently run in xdist's order."""
    from tests.conftest import FIRST_FILES, LONG_FILES

    root = Path(__file__).resolve().parents[1]
    missing = [name for name in FIRST_FILES + LONG_FILES if not (root / name).is_file()]
    assert not missing, f"tests/conftest.py names test files that do not exist: {missing}"
    assert len(set(FIRST_FILES + LONG_FILES)) == len(FIRST_FILES + LONG_FILES)
