"""One version: gpt2bench.__version__, and every copy of it in step.

The package's version is `gpt2bench.__version__` (pyproject.toml reads it). The chart's `version` and
`appVersion`, the image tags in manifests/ and the chart (its Deployment and trainer-image flags default to
appVersion), the CRD's default-image text, and the image tags the README and docs show must all be that
version: a release (`v<version>` tag, .github/workflows/release.yml) pushes the images under it, so a copy
left behind names an image that does not exist. The Kubeflow operator versions the e2e installs are pinned
once more in the operator's install hints; those must agree too.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

import gpt2bench
from gpt2bench.controller import followedkinds
from gpt2bench.specification.model import DEFAULT_GPU_IMAGE, DEFAULT_IMAGE

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "gpt2bench"
VERSION = gpt2bench.__version__
# An image of this project, with its tag: ghcr.io/gpt2bench/gpt2bench:0.1.0-cuda, ...-operator:0.1.0.
PROJECT_IMAGE = re.compile(r"ghcr\.io/gpt2bench/(gpt2bench(?:-operator)?):(\w(?:[\w.-]*\w)?)")
# Files that name released images. helm/gpt2bench/ci/ holds scenarios with made-up tags on purpose.
NAMING_FILES = ["README.md", "Dockerfile", "helm/gpt2bench/README.md", "helm/gpt2bench/values.yaml",
                "helm/gpt2bench/files/trainer-runtimes.yaml", "helm/gpt2bench/crds/gpt2benchmarks.gpt2bench.io.yaml",
                "manifests/crd.yaml", "manifests/operator.yaml", "manifests/runtimes.yaml",
                "operator/controller/main.py", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


def stale_image_tags(text: str, version: str) -> list[str]:
    """The project's image references in `text` whose tag is not `version` (or `version`-cuda, -cuda12)."""
    return [match.group(0) for match in PROJECT_IMAGE.finditer(text)
            if match.group(2) not in (version, f"{version}-cuda", f"{version}-cuda12")]


def test_the_package_version_is_read_from_gpt2bench_version() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"], "one version: gpt2bench.__version__, not a copy in pyproject"
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gpt2bench.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:[-.]?(?:a|b|rc)\d+)?", VERSION), VERSION


def test_the_chart_version_and_app_version_are_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION), (
        f"helm/gpt2bench/Chart.yaml says version {chart['version']}, appVersion {chart['appVersion']}; "
        f"gpt2bench.__version__ is {VERSION}")


def test_the_default_trainer_images_carry_the_version() -> None:
    assert DEFAULT_IMAGE == f"ghcr.io/gpt2bench/gpt2bench:{VERSION}"
    assert DEFAULT_GPU_IMAGE == f"ghcr.io/gpt2bench/gpt2bench:{VERSION}-cuda"


@pytest.mark.parametrize("path", NAMING_FILES)
def test_every_image_the_repository_names_has_the_version_tag(path: str) -> None:
    stale = stale_image_tags((ROOT / path).read_text(encoding="utf-8"), VERSION)
    assert not stale, f"{path} names images of another version than {VERSION}: {stale}"


def test_the_files_that_must_name_the_images_do() -> None:
    """The check above passes vacuously on a file without images: the ones that must have them, have them."""
    for path in ("manifests/operator.yaml", "manifests/runtimes.yaml", "manifests/crd.yaml", "README.md",
                 "helm/gpt2bench/crds/gpt2benchmarks.gpt2bench.io.yaml"):
        assert PROJECT_IMAGE.search((ROOT / path).read_text()), path


def test_the_crd_default_image_text_names_this_version() -> None:
    for crd in (ROOT / "manifests" / "crd.yaml", CHART / "crds" / "gpt2benchmarks.gpt2bench.io.yaml"):
        text = crd.read_text()
        assert f"else {DEFAULT_IMAGE}." in text and f"else {DEFAULT_GPU_IMAGE}." in text, crd


def test_the_manifests_operator_deployment_runs_this_version() -> None:
    docs = [d for d in yaml.safe_load_all((ROOT / "manifests" / "operator.yaml").read_text()) if d]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"ghcr.io/gpt2bench/gpt2bench-operator:{VERSION}"
    assert f"--trainer-image-cpu={DEFAULT_IMAGE}" in container["args"]
    assert f"--trainer-image-gpu={DEFAULT_GPU_IMAGE}" in container["args"]
    labelled = [d["metadata"]["labels"]["app.kubernetes.io/version"] for d in docs
                if "app.kubernetes.io/version" in d["metadata"].get("labels", {})]
    assert labelled and set(labelled) == {VERSION}


def test_a_stale_tag_is_found() -> None:
    text = ("image: ghcr.io/gpt2bench/gpt2bench-operator:0.1.0\n"
            "docker build -t ghcr.io/gpt2bench/gpt2bench:0.0.9-cuda --target trainer-cuda .\n"
            "--trainer-image-cpu=ghcr.io/gpt2bench/gpt2bench:0.1.0\n")
    assert stale_image_tags(text, "0.1.0") == ["ghcr.io/gpt2bench/gpt2bench:0.0.9-cuda"]
    assert stale_image_tags(text, "0.2.0") == ["ghcr.io/gpt2bench/gpt2bench-operator:0.1.0",
                                               "ghcr.io/gpt2bench/gpt2bench:0.0.9-cuda",
                                               "ghcr.io/gpt2bench/gpt2bench:0.1.0"]


def _script_default(name: str) -> str:
    """A pinned default of scripts/e2e-kind.sh: NAME=${ENV:-"value"}."""
    text = (ROOT / "scripts" / "e2e-kind.sh").read_text()
    match = re.search(rf'^{name}=\$\{{[A-Z0-9_]+:-"([^"]+)"\}}$', text, re.M)
    assert match, f"scripts/e2e-kind.sh has no pinned {name}"
    return match.group(1)


def test_the_e2e_installs_the_operator_versions_the_operator_tells_users_to_install() -> None:
    kustomization = yaml.safe_load((ROOT / "manifests" / "kubeflow" / "training-operator" / "kustomization.yaml")
                                   .read_text())
    assert kustomization["resources"] == [followedkinds.TRAINING_OPERATOR_OVERLAY]
    assert "-k manifests/kubeflow/training-operator " in followedkinds.TRAINING_OPERATOR_INSTALL
    assert _script_default("MPI_OPERATOR") in followedkinds.MPI_OPERATOR_INSTALL
    assert _script_default("TRAINER_V2") in followedkinds.TRAINER_V2_INSTALL
    assert re.fullmatch(r"kindest/node:v1\.(3[1-9]|[4-9]\d)\.\d+", _script_default("TRAINER_V2_NODE_IMAGE")), (
        "Trainer v2 needs Kubernetes 1.31 or later")


def test_the_release_version_step_accepts_the_version_tag_and_refuses_another(tmp_path: Path) -> None:
    """The release workflow's own version check, run here: v<version> passes, any other tag fails; the registry
    is the repository owner's, in lower case (ghcr.io refuses upper case)."""
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    step = next(s for s in workflow["jobs"]["version"]["steps"] if s.get("id") == "version")
    for tag, ok in ((f"v{VERSION}", True), (f"v{VERSION}.1", False), ("v0.0.0", False)):
        output = tmp_path / f"out-{tag}"
        proc = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=ROOT, capture_output=True, text=True, timeout=30,
                              env={"PATH": "/usr/bin:/bin", "GITHUB_REF_NAME": tag, "GITHUB_OUTPUT": str(output),
                                   "GITHUB_REPOSITORY_OWNER": "Some-Owner"})
        assert (proc.returncode == 0) == ok, (tag, proc.stdout, proc.stderr)
        if ok:
            assert output.read_text() == f"version={VERSION}\nregistry=ghcr.io/some-owner\n"
