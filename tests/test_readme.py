"""The README a first reader finishes: its two commands are the ones the Makefile and CI run, its YAML is the
default example's sweep, and it stays short (everything else is in docs/, which it links)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpt2bench.specification.validation import load_benchmark

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
EXAMPLE = yaml.safe_load((ROOT / "manifests" / "examples" / "cpu-sweep.yaml").read_text(encoding="utf-8"))


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, re.M | re.S)


def test_the_first_two_commands_run_the_local_benchmark_then_the_tests():
    """`make demo` and `.ci/run` (via `make test`) stand for these two lines: the first installs and runs the
    default example, the second installs the rest and runs the suite."""
    first = blocks("bash")[0]
    commands = [line.split("#")[0].strip() for line in first.splitlines()]
    assert commands == ["scripts/install.sh && .venv/bin/gpt2bench run manifests/examples/cpu-sweep.yaml",
                        "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert "$(VENV)/bin/gpt2bench run manifests/examples/cpu-sweep.yaml" in makefile
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("make test")


def test_the_yaml_is_a_valid_benchmark_with_the_default_examples_sweep():
    (block,) = blocks("yaml")
    shown = yaml.safe_load(block)
    load_benchmark(shown)  # raises SpecError with the field's path when it is not
    assert shown["metadata"]["name"] == EXAMPLE["metadata"]["name"]
    assert shown["spec"]["sweep"] == EXAMPLE["spec"]["sweep"]
    for section in ("model", "training"):
        assert shown["spec"][section].items() <= EXAMPLE["spec"][section].items(), section
    assert shown["spec"]["data"]["source"] == EXAMPLE["spec"]["data"]["source"]


def test_the_readme_stays_short_and_links_what_moved_out():
    assert len(README.splitlines()) <= 150, "a first reader finishes it: the rest belongs in docs/"
    for page in ("docs/install.md", "docs/quickstart.md", "docs/default-run.md", "docs/ci.md", "docs/design.md"):
        assert f"]({page})" in README and (ROOT / page).is_file(), page
