"""The images' Python dependencies are locked with hashes (requirements/README.md): the `.in` files repeat
pyproject's pins, the locks cover them (and every package they pull in, each file hashed), and the Dockerfile
installs nothing from PyPI but through a lock with --require-hashes."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements"
DOCKERFILE = (ROOT / "Dockerfile").read_text()
PYPROJECT = {canonicalize_name(Requirement(d).name): Requirement(d)
             for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
NOT_FROM_PYPI = {"torch"}  # from the PyTorch index at the Dockerfile's TORCH_VERSION


def inputs(name: str) -> list[Requirement]:
    lines = (REQUIREMENTS / f"{name}.in").read_text().splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith(("#", "-c"))]


def lock(name: str) -> dict[str, tuple[Version, list[str]]]:
    """Package -> (pinned version, its hashes), as pip-compile writes them."""
    text = (REQUIREMENTS / f"{name}.lock").read_text()
    entries = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        match = re.match(r"([A-Za-z0-9._-]+)==(\S+)", block)
        if match:
            entries[canonicalize_name(match.group(1))] = (Version(match.group(2)),
                                                          re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
    return entries


@pytest.mark.parametrize("name", ["operator", "trainer"])
def test_the_inputs_repeat_pyprojects_pins(name):
    for requirement in inputs(name):
        assert str(PYPROJECT[canonicalize_name(requirement.name)]) == str(requirement), requirement


def test_the_trainer_lock_covers_every_runtime_dependency_but_torch():
    assert {canonicalize_name(r.name) for r in inputs("trainer")} == set(PYPROJECT) - NOT_FROM_PYPI
    assert "scipy" in PYPROJECT and "scipy" in {canonicalize_name(r.name) for r in inputs("operator")}


@pytest.mark.parametrize("name", ["operator", "trainer", "horovod"])
def test_every_locked_package_satisfies_its_input_and_is_hashed(name):
    locked = lock(name)
    assert locked and all(hashes for _, hashes in locked.values()), "a package without hashes"
    for requirement in inputs(name):
        version, _ = locked[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(version, prereleases=True), (requirement, version)
    assert not NOT_FROM_PYPI & set(locked)
    assert "/opt/" not in (REQUIREMENTS / f"{name}.lock").read_text()  # resolved against PyPI, not local wheels


@pytest.mark.parametrize("other", ["operator", "horovod"])
def test_packages_in_two_locks_are_pinned_alike(other):
    trainer, locked = lock("trainer"), lock(other)
    shared = set(trainer) & set(locked)
    assert shared and {n: locked[n][0] for n in shared} == {n: trainer[n][0] for n in shared}


def test_the_dockerfile_installs_python_packages_only_through_the_locks():
    installs = re.findall(r"pip install ([^&\n\\]*)", DOCKERFILE)
    locked = [i for i in installs if "--require-hashes" in i]
    assert {re.search(r"-r (requirements/\S+\.lock)", i).group(1) for i in locked} == \
        {"requirements/operator.lock", "requirements/trainer.lock", "requirements/horovod.lock"}
    for install in installs:
        if "--require-hashes" in install:
            assert "--no-deps" in install
            continue
        # the rest: build tools pinned by version, torch from its index, the project itself without deps
        assert ('"setuptools==' in install or '"torch==${TORCH_VERSION}"' in install
                or install.strip().startswith("--no-deps --no-build-isolation .")), install
