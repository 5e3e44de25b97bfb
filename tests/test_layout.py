"""The repository's layout: nothing at its root may shadow Python's standard library.

Anyone who runs Python from the repository root (a script, a notebook, `python -m json.tool`) gets the
root on `sys.path` first. A top-level package named like a standard-library module (`operator/` with an
`__init__.py`) would then replace that module and break `enum`, `json`, ... for them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def importable_top_level_names(root: Path) -> set[str]:
    """Names `import NAME` would find at `root`: modules, and folders that are regular packages."""
    names = {p.stem for p in root.glob("*.py")}
    names |= {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    return names


def test_no_top_level_module_or_package_is_named_like_a_standard_library_module():
    shadowing = importable_top_level_names(REPO) & set(sys.stdlib_module_names)
    assert not shadowing, f"these would shadow the standard library from the repository root: {sorted(shadowing)}"


def test_the_operator_folder_is_there_but_not_a_package():
    assert (REPO / "operator" / "controller" / "handlers.py").is_file()
    assert not (REPO / "operator" / "__init__.py").exists()


def test_the_detector_sees_a_shadowing_package(tmp_path):
    (tmp_path / "operator").mkdir()
    (tmp_path / "operator" / "__init__.py").write_text("")
    (tmp_path / "enum.py").write_text("")
    (tmp_path / "trainer").mkdir()  # not a package: no __init__.py
    assert importable_top_level_names(tmp_path) & set(sys.stdlib_module_names) == {"operator", "enum"}


@pytest.fixture(scope="module")
def plain_python(tmp_path_factory) -> Path:
    """A plain virtual environment: the standard library and nothing of ours installed."""
    env_dir = tmp_path_factory.mktemp("plain-venv")
    venv.EnvBuilder(with_pip=False).create(env_dir)
    return env_dir / "bin" / "python"


def test_the_standard_library_runs_from_the_repository_root(plain_python):
    tool = subprocess.run([str(plain_python), "-m", "json.tool"], input='{"a": [1, 2]}', capture_output=True,
                          text=True, cwd=REPO, timeout=60, check=False)
    assert tool.returncode == 0, tool.stderr
    assert '"a"' in tool.stdout
    probe = ("import enum, json, operator, sys; "
             "assert operator.__file__.startswith(sys.base_prefix), operator.__file__; "
             "assert operator.eq(1, 1); print(operator.__file__)")
    result = subprocess.run([str(plain_python), "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert not result.stdout.startswith(str(REPO))


def test_ruff_finds_no_unused_or_undefined_names_and_imports_are_sorted():
    ruff = shutil.which("ruff")
    assert ruff, "ruff is a test dependency (pip install -e '.[test]')"
    result = subprocess.run([ruff, "check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- dependencies point one way
# Package paths as installed (pyproject's package-dir), so the rule reads as the imports do.
SOURCES = {"gpt2bench": REPO / "gpt2bench", "gpt2bench.trainer": REPO / "trainer",
           "gpt2bench.controller": REPO / "operator" / "controller"}
# The stages in import order (docs/design.md, Dependencies): a module may import its own group and the groups
# before it, nothing after it and no other group of its own rank. The shared contracts come first; the
# drivers (the local runner and the operator) come after report because they run every stage in turn, and
# they never import each other.
STAGES = [
    ("gpt2bench.conventions",),
    ("gpt2bench.strategies", "gpt2bench.objectives"),  # the extension points' tables: they import nothing of ours
    ("gpt2bench.clock",),
    ("gpt2bench.files",),
    ("gpt2bench.status",),
    ("gpt2bench.jobkinds",),
    ("gpt2bench.specification",),
    ("gpt2bench.trainer",),
    ("gpt2bench.plan",),
    ("gpt2bench.render",),
    ("gpt2bench.collect",),
    ("gpt2bench.diagnosis",),
    ("gpt2bench.launch",),
    ("gpt2bench.report",),
    ("gpt2bench.sweepcore",),  # the rules both drivers ask; it asks neither
    ("gpt2bench.local", "gpt2bench.controller"),
    ("gpt2bench.cli",),
    ("gpt2bench.__main__",),
]


def module_imports(package: str, root: Path) -> dict[str, set[str]]:
    """Every module under `root` (named as installed) -> the absolute names it imports."""
    import ast

    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join([package, *parts])
        imports = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imports |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    anchor = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    base = ".".join(anchor[: len(anchor) - node.level + 1] + ([base] if base else []))
                imports |= {f"{base}.{alias.name}" for alias in node.names} | {base}
        found[name] = imports
    return found


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def stage_of(name: str) -> tuple[int, str] | None:
    """(rank, group) of a gpt2bench module or imported name; None for the package root (`__version__`) and
    anything outside gpt2bench."""
    for rank, group in enumerate(STAGES):
        for prefix in group:
            if _within(name, prefix):
                return rank, prefix
    return None


def dependency_violations(modules: dict[str, set[str]]) -> list[str]:
    problems = []
    for module, imports in modules.items():
        here = stage_of(module)
        assert here is not None or module == "gpt2bench", f"{module} belongs to no stage: add it to STAGES"
        for name in sorted(imports):
            there = stage_of(name)
            if here is None or there is None or there[1] == here[1]:
                continue
            if there[0] >= here[0]:
                problems.append(f"{module} imports {name}")
    return problems


def test_dependencies_point_one_way():
    modules = {}
    for package, root in SOURCES.items():
        modules |= module_imports(package, root)
    assert "gpt2bench.trainer.config" in modules and "gpt2bench.controller.sweep" in modules
    assert dependency_violations(modules) == []


def test_the_dependency_rule_catches_an_import_against_the_flow():
    assert dependency_violations({"gpt2bench.trainer.metrics": {"gpt2bench.collect.SUMMARY_PREFIX"}}) == [
        "gpt2bench.trainer.metrics imports gpt2bench.collect.SUMMARY_PREFIX"]
    assert dependency_violations({"gpt2bench.local.sweep": {"gpt2bench.controller.decide"}})
    assert dependency_violations({"gpt2bench.conventions": {"gpt2bench.specification.model"}})
    assert dependency_violations({"gpt2bench.specification.crd": {"gpt2bench.plan"}}) == [
        "gpt2bench.specification.crd imports gpt2bench.plan"]
    assert dependency_violations({"gpt2bench.report.build": {"gpt2bench.local.sweep"}})
    assert dependency_violations({"gpt2bench.controller.sweep": {"gpt2bench.render", "gpt2bench.status",
                                                                 "gpt2bench.report.build"}}) == []
    assert dependency_violations({"gpt2bench.specification.validation": {"gpt2bench.specification.model", "gpt2bench"}}) == []


def import_circles(modules: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (imports inside functions count: a lazy import
    hides a circle, it does not break it), each sorted; a module importing a name of another counts."""
    import graphlib

    def target(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges = {module: {t for name in imports if (t := target(name)) and t != module and not _within(module, t)}
             for module, imports in modules.items()}
    circles = []
    while edges:
        try:
            graphlib.TopologicalSorter(edges).prepare()
            break
        except graphlib.CycleError as error:
            cycle = sorted(set(error.args[1]))
            circles.append(cycle)
            for module in cycle:  # report it, then look for more without it
                edges.pop(module, None)
            edges = {m: targets - set(cycle) for m, targets in edges.items()}
    return circles


def test_no_import_circles_in_the_package():
    modules = {}
    for package, root in SOURCES.items():
        modules |= module_imports(package, root)
    assert import_circles(modules) == []


def test_the_circle_check_sees_a_lazy_two_module_circle():
    modules = {"gpt2bench.a": {"gpt2bench.b.f"}, "gpt2bench.b": {"gpt2bench.a"}, "gpt2bench.c": {"gpt2bench.a"},
               "gpt2bench.report": set(), "gpt2bench.report.x": {"gpt2bench.report"}}  # a package's own module: no
    assert import_circles(modules) == [["gpt2bench.a", "gpt2bench.b"]]


def test_every_package_folder_is_listed_for_installation():
    """pyproject lists packages explicitly (the trainer and operator live outside gpt2bench/), so a new
    subpackage that is not listed is missing from `pip install .` and the image, though editable installs work."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {name: Path(path) for name, path in setuptools["package-dir"].items()}
    expected = set()
    for name, folder in folders.items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder).parts
            expected.add(".".join((name, *relative)))
    assert expected - set(setuptools["packages"]) == set()


# Build outputs and caches: the only things a checkout may hold that a fresh clone lacks (at the root, and
# Python's caches anywhere).
ROOT_OUTPUTS = {".hypothesis", ".pytest_cache", ".ruff_cache", ".tools", ".venv", "build", "dist", "results", "out"}


def ignored_sources(repo: Path) -> list[str]:
    """Paths present in `repo` that git ignores and that are not build outputs or caches: files the tests and docs
    find here and a fresh clone (CI's) does not have."""
    if not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    listing = subprocess.run(["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--directory"],
                             cwd=repo, capture_output=True, text=True, check=True).stdout
    # the listing also names an untracked folder that holds only ignored files; check-ignore keeps the ignored
    paths = subprocess.run(["git", "check-ignore", "--stdin"], cwd=repo, input=listing, capture_output=True,
                           text=True).stdout.splitlines()
    return [p for p in paths if Path(p).parts[0] not in ROOT_OUTPUTS
            and not any(part == "__pycache__" or part.endswith((".egg-info", ".pyc")) for part in Path(p).parts)]


def test_nothing_the_checkout_holds_is_ignored_unless_it_is_built():
    """Today's bug: `results/` in .gitignore also matched docs/results/, so the README's measured figures and
    their test passed here and failed on CI's fresh clone, which never had them."""
    assert ignored_sources(REPO) == []


def test_an_ignored_source_file_is_seen(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("results/\n")
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "results.json").write_text("{}")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "run.json").write_text("{}")
    assert ignored_sources(tmp_path) == ["docs/results/"]


# A tool at a fixed absolute path: the development machine's /usr/bin/kubectl made 100+ tests fail with
# FileNotFoundError on a stock Debian 12 (none there; the official install goes to /usr/local/bin).
FIXED_TOOL_PATH = re.compile(r"""["'](?:/usr(?:/local)?)?/s?bin/(kubectl|helm|kind|docker)\b""")
CODE = (".py", ".sh", ".yml", ".yaml", "Makefile")


def fixed_tool_paths(root: Path) -> list[str]:
    """file:line of every string literal in tracked code that names kubectl, helm, kind or docker by an
    absolute path (tests find them with tests/kube/tools.py: where install.sh put them, else PATH)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout.decode()
    found = []
    for name in filter(None, listed.split("\0")):
        path = root / name
        if not name.endswith(CODE) or name.startswith("tests/data/") or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if FIXED_TOOL_PATH.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    return found


def test_no_code_runs_kubectl_or_helm_from_a_fixed_path():
    assert fixed_tool_paths(REPO) == []


def test_a_fixed_kubectl_path_is_seen(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "tests").mkdir()
    hard_coded = 'KUBECTL = "/usr/bin/' + 'kubectl"'  # split: this file must not match itself
    (tmp_path / "tests" / "test_x.py").write_text(f'{hard_coded}\nHELM = shutil.which("helm")\n')
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    assert fixed_tool_paths(tmp_path) == [f"tests/test_x.py:1: {hard_coded}"]
