"""scripts/install.sh stops at the first failing step, naming it and what to do: never a silent exit 0.

Each test runs the real script with one step made to fail: a stand-in Python (first on PATH as python3, and the
virtual environment's python) runs the real interpreter for everything except the step under test, whose
command it fails as pip would. Nothing is installed (pip is answered by the stand-in), so each run takes
seconds. Where the whole script runs for real (a fresh clone here, a stock Debian 12 root, CI) is docs/ci.md's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install.sh"

# The real interpreter, except: a command line containing one of $FAIL's |-separated parts fails; pip's
# installs and downloads answer success without doing anything (a later step can be reached, nothing installed).
STAND_IN = """#!/usr/bin/env bash
args="$*"
IFS='|' read -ra parts <<<"$FAIL"
for part in "${parts[@]}"; do
  if [[ "$args" == *"$part"* ]]; then
    echo "ERROR: (stand-in) python $args failed" >&2
    exit 1
  fi
done
case "$args" in
  "-m pip install"* | "-m pip download"*) echo "(stand-in) python $args" >>"$STAND_IN_LOG"; exit 0 ;;
  "-m venv"*) echo "(stand-in) python $args" >>"$STAND_IN_LOG"; exit 0 ;;
esac
exec "$REAL_PYTHON" "$@"
"""


def run_install(tmp_path: Path, fail: str, *args: str) -> subprocess.CompletedProcess[str]:
    bin_dir, venv = tmp_path / "bin", tmp_path / "venv"
    for folder in (bin_dir, venv / "bin"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ("python3" if folder == bin_dir else "python")).write_text(STAND_IN)
        (folder / ("python3" if folder == bin_dir else "python")).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "FAIL": fail,
           "REAL_PYTHON": sys.executable, "STAND_IN_LOG": str(tmp_path / "pip.log"), "GPT2BENCH_VENV": str(venv)}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("fail", "step", "advice"), [
    ("-e .", 'step "gpt2bench"', "PyPI is reachable"),  # pip install of the package itself
    ("horovod", 'step "Horovod 0.28.1"', "SKIP_HOROVOD=1"),  # Horovod's build
    ("torch", 'step "torch 2.13.0"', "TORCH_INDEX_URL"),  # torch from every source
])
def test_a_failing_step_stops_the_install_with_its_name_and_what_to_do(tmp_path: Path, fail: str, step: str,
                                                                      advice: str) -> None:
    proc = run_install(tmp_path, fail)
    assert proc.returncode != 0, f"install.sh exited 0 although {fail!r} failed:\n{proc.stderr}"
    assert f"install.sh: {step} failed" in proc.stderr and advice in proc.stderr, proc.stderr
    assert "install: done" not in proc.stderr + proc.stdout


def test_without_a_gpu_torch_comes_from_the_configured_sources_then_the_cpu_index(tmp_path: Path) -> None:
    """No GPU here: pip's own sources without an index first (offline, at once), then PyTorch's CPU index,
    never PyPI's default (the multi-GB CUDA build)."""
    proc = run_install(tmp_path, "import torch|--no-index")  # no torch yet, none from local sources
    attempts = [line for line in (tmp_path / "pip.log").read_text().splitlines() if "torch==" in line]
    assert attempts == ["(stand-in) python -m pip install -q --index-url https://download.pytorch.org/whl/cpu "
                        "torch==2.13.0"], proc.stderr
    assert "torch 2.13.0 (CPU) from https://download.pytorch.org/whl/cpu" in proc.stderr


def test_an_unknown_argument_is_refused() -> None:
    proc = subprocess.run(["bash", str(SCRIPT), "--tset"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "unknown argument --tset" in proc.stderr
