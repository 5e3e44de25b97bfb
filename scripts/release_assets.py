"""What a release publishes besides the images, pointed at the registry it publishes to (ghcr.io/<owner>).

    python scripts/release_assets.py --registry ghcr.io/acme               # the chart names ghcr.io/acme/... images
    python scripts/release_assets.py --registry ghcr.io/acme --output DIR  # and writes the GitHub Release's files

The checkout's chart names this repository's images (ghcr.io/gpt2bench/...). A release by another owner (a
fork) pushes its images under its own name, so the chart it packages and the manifests it attaches must name
those: the image repositories in the chart's values.yaml are rewritten in place (release.yml runs this in a
throwaway checkout; the chart's runtimes follow trainerImage), and so are the chart's home and sources, from
which its NOTES link to the release's example and CRD (`--repository`). `--output DIR` then writes crd.yaml,
operator.yaml and runtimes.yaml (the chart's render, as scripts/generate_manifests.py makes manifests/) and
NOTES.md (the release notes: what was published and how to install and verify it).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

import generate_manifests  # scripts/ is this script's folder, first on sys.path

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "gpt2bench"
PUBLISHED = "ghcr.io/gpt2bench"  # the registry the checkout names (gpt2bench.specification.model.TRAINER_REPOSITORY's)
# Where the chart names its images: the repositories of image and trainerImage.
VALUES = CHART / "values.yaml"
REPOSITORY = re.compile(rf"^(  repository: ){re.escape(PUBLISHED)}/", re.M)
PUBLISHED_HOME = "https://github.com/gpt2bench/gpt2bench"  # the chart's home and sources
HOME = re.compile(rf"^(home: |  - ){re.escape(PUBLISHED_HOME)}$", re.M)
REGISTRY = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:\d+)?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$")
NOTES = """\
gpt2bench {version}: images, chart and manifests in `{registry}`.

| artifact | reference |
|---|---|
| operator image | `{registry}/gpt2bench-operator:{version}` (linux/amd64, linux/arm64) |
| CPU trainer image | `{registry}/gpt2bench:{version}` (linux/amd64, linux/arm64) |
| GPU trainer image, CUDA 13 (NVIDIA driver >= 580) | `{registry}/gpt2bench:{version}-cuda` (linux/amd64) |
| GPU trainer image, CUDA 12.8 (NVIDIA driver >= 570) | `{registry}/gpt2bench:{version}-cuda12` (linux/amd64) |
| Helm chart | `oci://{registry}/charts/gpt2bench` version {version} |

A package the release workflow's `public` job lists as not pullable did not publish, or is still private.

Install with Helm (the operator watches its own namespace; `--set operator.allNamespaces=true`: every one):

```bash
helm install gpt2bench oci://{registry}/charts/gpt2bench --version {version} -n gpt2bench-system --create-namespace
```

or without Helm, from this release's files:

```bash
kubectl apply --server-side -f crd.yaml
kubectl apply -f operator.yaml          # namespace gpt2bench-system
kubectl apply -f runtimes.yaml          # Kubeflow Trainer v2 clusters only, after Trainer v2
```

GPU nodes with a driver older than 580: `--set trainerImage.gpuTag={version}-cuda12`. Every image and the chart
are signed with cosign, keyless, by this repository's release workflow:

```bash
cosign verify {registry}/gpt2bench:{version} --certificate-oidc-issuer https://token.actions.githubusercontent.com \\
  --certificate-identity-regexp '^https://github.com/{repository}/.github/workflows/image.yml@refs/tags/v{version}$'
```
"""


def point_chart_at(registry: str) -> None:
    """Rewrite the chart's image repositories from PUBLISHED to `registry` (in place); refuse a chart whose
    two repositories (the operator's, the trainer's) are not where they are expected."""
    text, count = REPOSITORY.subn(lambda match: f"{match.group(1)}{registry}/", VALUES.read_text())
    if count != 2:
        raise SystemExit(f"{VALUES.relative_to(REPO)}: {count} repositories under {PUBLISHED}/, not 2 (image, "
                         "trainerImage): update scripts/release_assets.py")
    VALUES.write_text(text)


def point_home_at(repository: str) -> None:
    """Rewrite the chart's `home` and `sources` (the NOTES' links to the release's files derive from `home`)
    to `repository`'s GitHub page, in place."""
    chart = CHART / "Chart.yaml"
    text, count = HOME.subn(lambda match: f"{match.group(1)}https://github.com/{repository}", chart.read_text())
    if count != 2:
        raise SystemExit(f"{chart.relative_to(REPO)}: {count} links to {PUBLISHED_HOME}, not 2 (home, sources): "
                         "update scripts/release_assets.py")
    chart.write_text(text)


def write_assets(output: Path, registry: str, version: str, repository: str) -> list[Path]:
    output.mkdir(parents=True, exist_ok=True)
    written = [output / "crd.yaml", output / "operator.yaml", output / "runtimes.yaml", output / "NOTES.md"]
    shutil.copyfile(REPO / "manifests" / "crd.yaml", written[0])
    written[1].write_text(generate_manifests.render(), encoding="utf-8")
    written[2].write_text(generate_manifests.render_runtimes(), encoding="utf-8")
    written[3].write_text(NOTES.format(registry=registry, version=version, repository=repository), encoding="utf-8")
    return written


def chart_version() -> str:
    match = re.search(r'^appVersion: *"?([^"\s]+)"?\s*$', (CHART / "Chart.yaml").read_text(), re.M)
    assert match, "helm/gpt2bench/Chart.yaml has no appVersion"
    return match.group(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", required=True, help="where the release's images are, e.g. ghcr.io/acme")
    parser.add_argument("--output", type=Path, help="write crd.yaml, operator.yaml, runtimes.yaml and NOTES.md here")
    parser.add_argument("--repository", default="gpt2bench/gpt2bench",
                        help="the GitHub repository (owner/name) releasing: the chart's home (its NOTES link to the release's "
                             "files there) and NOTES.md's cosign identity")
    args = parser.parse_args(argv)
    if not REGISTRY.fullmatch(args.registry):
        parser.error(f"--registry must be a lower-case registry path such as ghcr.io/acme, got {args.registry!r}")
    if args.output and not generate_manifests.HELM.exists():
        print(f"helm not installed at {generate_manifests.HELM} (run scripts/install.sh --test)", file=sys.stderr)
        return 2
    point_chart_at(args.registry)
    point_home_at(args.repository)
    print(f"the chart names {args.registry}/ images and links to https://github.com/{args.repository}")
    if args.output:
        for path in write_assets(args.output, args.registry, chart_version(), args.repository):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
