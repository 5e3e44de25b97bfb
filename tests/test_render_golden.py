"""`gpt2bench render` output, byte for byte, against goldens: a refactor of the renderers must not change a
single rendered field, and a change that is meant must show up here as a diff to review.

Inputs: tests/data/render/*.yaml (every setting the renderers read, and their defaults), each rendered for
both backends (`--backend trainjob`, `--backend pytorchjob`: PyTorchJobs and, for horovod, MPIJobs), except
an input whose spec names its backend (what only that backend can carry), rendered for it alone.
Goldens: tests/data/render/golden/<input>.<backend>.yaml. After an intended change, rewrite them with
`GPT2BENCH_UPDATE_GOLDEN=1 pytest tests/test_render_golden.py` and review `git diff`. The default images'
tag is written as VERSION, so that a release does not rewrite them.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from gpt2bench import __version__
from gpt2bench.jobkinds import BACKENDS
from gpt2bench.render.cli import main

DATA = Path(__file__).resolve().parent / "data" / "render"
GOLDEN = DATA / "golden"
INPUTS = sorted(DATA.glob("*.yaml"))
UPDATE = os.environ.get("GPT2BENCH_UPDATE_GOLDEN") == "1"


def test_there_are_inputs_for_every_backend():
    assert {p.stem for p in INPUTS} >= {"every-setting", "defaults", "pytorchjob-only"}
    assert {(s.stem, b) for s, b in CASES} >= {("every-setting", "trainjob"), ("pytorchjob-only", "pytorchjob")}
    assert ("pytorchjob-only", "trainjob") not in {(s.stem, b) for s, b in CASES}
    assert set(BACKENDS) == {"trainjob", "pytorchjob"}
    assert "gpt2bench:VERSION-cuda" in (GOLDEN / "defaults.pytorchjob.yaml").read_text(encoding="utf-8")


def named_backend(source: Path) -> str | None:
    import yaml

    return (yaml.safe_load(source.read_text(encoding="utf-8"))["spec"]).get("backend")


CASES = [(source, backend) for source in INPUTS for backend in BACKENDS
         if named_backend(source) in (None, "auto", backend)]


@pytest.mark.parametrize(("source", "backend"), CASES, ids=[f"{s.stem}-{b}" for s, b in CASES])
def test_render_output_matches_its_golden(source, backend, capsys):
    assert main([str(source), "--backend", backend]) == 0
    rendered = capsys.readouterr().out.replace(f"gpt2bench:{__version__}", "gpt2bench:VERSION")
    golden = GOLDEN / f"{source.stem}.{backend}.yaml"
    if UPDATE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(rendered, encoding="utf-8")
    assert golden.is_file(), f"no golden {golden}: write it with GPT2BENCH_UPDATE_GOLDEN=1"
    expected = golden.read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(expected.splitlines(True), rendered.splitlines(True),
                                        str(golden), "rendered", n=2))
    assert rendered == expected, f"render output changed (GPT2BENCH_UPDATE_GOLDEN=1 if meant):\n{diff[:6000]}"
