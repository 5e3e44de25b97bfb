# syntax=docker/dockerfile:1
# gpt2bench images, one Dockerfile, three targets:
#
#   docker build -t ghcr.io/gpt2bench/gpt2bench:0.1.0 .                                  # trainer (CPU; default)
#   docker build -t ghcr.io/gpt2bench/gpt2bench:0.1.0-cuda --target trainer-cuda .       # trainer (GPU, CUDA 13)
#   docker build -t ghcr.io/gpt2bench/gpt2bench-operator:0.1.0 --target operator .       # operator, no torch
#   docker build -t ghcr.io/gpt2bench/gpt2bench:0.1.0-cuda12 --target trainer-cuda .     # trainer (GPU, CUDA 12.8)
#     with --build-arg CUDA_IMAGE_VERSION=12.8.1 --build-arg TORCH_CUDA_INDEX_URL=https://download.pytorch.org/whl/cu128
#
# - trainer: CPU torch, Horovod with Gloo + MPI, Open MPI and sshd (MPIJob launchers and workers).
# - trainer-cuda: CUDA torch wheels and Horovod built with HOROVOD_GPU_OPERATIONS=NCCL on nvidia/cuda devel,
#   run on the matching nvidia/cuda runtime (its CUDA runtime and NCCL); needs the NVIDIA device plugin and a
#   driver that runs its CUDA: CUDA 13 (-cuda, the default) needs driver >= 580, CUDA 12.8 (-cuda12) >= 570
#   (`nvidia-smi` prints the node's). cuDNN comes with torch's wheels (its nvidia-cudnn-cu* requirement), so the
#   bases are the plain devel/runtime ones, not -cudnn-. GPT2Benchmark runs with devicesPerNode > 0 use it by
#   default (spec.images.gpu; the chart's trainerImage.gpuTag picks -cuda12).
# - operator: `gpt2bench operator` (kopf, kubernetes client, pydantic): what the Helm chart deploys.
# Python packages are installed from requirements/*.lock with --require-hashes (requirements/README.md): an
# image built twice has the same files. torch comes from the PyTorch index at TORCH_VERSION.
# The trainers run as uid 1000 with sshd on port 2222 (docker/trainer-user.sh): Pod Security "restricted".

ARG PYTHON_VERSION=3.11
ARG TORCH_VERSION=2.13.0
ARG HOROVOD_VERSION=0.28.1
# CUDA images: the torch wheel index and the nvidia/cuda tag must name the same CUDA version (the release
# builds CUDA 12.8 as -cuda12 with 12.8.1 and .../whl/cu128: .github/workflows/release.yml).
ARG CUDA_IMAGE_VERSION=13.0.1
ARG CUDA_UBUNTU=ubuntu24.04
ARG TORCH_CUDA_INDEX_URL=https://download.pytorch.org/whl/cu130

# ------------------------------------------------------------------------------------ operator build
FROM python:${PYTHON_VERSION}-slim-bookworm AS operator-build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The package without its trainer dependencies (torch, transformers, matplotlib ...): only what the
# operator imports (requirements/operator.in), every file pinned by its hash (requirements/operator.lock).
# tests/test_dockerfile.py keeps operator.in equal to pyproject's pins and checks that the operator's
# modules import nothing else.
COPY requirements/operator.lock requirements/
RUN python -m venv /opt/venv \
 && pip install "setuptools==80.9.0" "wheel==0.45.1" \
 && pip install --no-deps --require-hashes -r requirements/operator.lock
COPY pyproject.toml README.md ./
COPY gpt2bench/ gpt2bench/
COPY trainer/ trainer/
COPY operator/ operator/
RUN pip install --no-deps --no-build-isolation . \
 && python -m compileall -q /opt/venv \
 && gpt2bench operator --help >/dev/null

# ------------------------------------------------------------------------------------------ operator
FROM python:${PYTHON_VERSION}-slim-bookworm AS operator
LABEL org.opencontainers.image.title="gpt2bench-operator" \
      org.opencontainers.image.description="gpt2bench operator: GPT2Benchmarks become Kubeflow jobs" \
      org.opencontainers.image.source="https://github.com/gpt2bench/gpt2bench" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=operator-build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 1000:1000
ENTRYPOINT ["gpt2bench"]
CMD ["operator", "--help"]

# -------------------------------------------------------------------------------------- CUDA build
FROM nvidia/cuda:${CUDA_IMAGE_VERSION}-devel-${CUDA_UBUNTU} AS cuda-build
ARG TORCH_VERSION
ARG TORCH_CUDA_INDEX_URL
ARG HOROVOD_VERSION
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Python 3.12 (Ubuntu 24.04's), compilers, Open MPI headers and NCCL's headers for Horovod. Libraries for
# other fabrics (e.g. EFA, aws-ofi-nccl) go in a RUN of their own after this one, and their runtime parts
# in trainer-cuda's.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3.12 python3.12-venv \
      python3.12-dev g++ make cmake libopenmpi-dev openmpi-bin libnccl-dev \
 && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3.12 -m venv /opt/venv \
 && pip install "setuptools==80.9.0" "wheel==0.45.1" \
 && pip install --index-url "${TORCH_CUDA_INDEX_URL}" "torch==${TORCH_VERSION}"
# Everything else from PyPI, every file pinned by its hash (requirements/trainer.lock).
WORKDIR /src
COPY requirements/trainer.lock requirements/horovod.lock requirements/
RUN pip install --no-deps --require-hashes -r requirements/trainer.lock
COPY pyproject.toml README.md ./
COPY gpt2bench/ gpt2bench/
COPY trainer/ trainer/
COPY operator/ operator/
RUN pip install --no-deps --no-build-isolation . && pip check && gpt2bench --version
# Horovod with NCCL all-reduce on GPU tensors (plus Gloo and MPI), for the cards of the last generations
# (A100 8.0, A10/3090 8.6, L4/4090 8.9, H100 9.0); same C++17 wrapper as the CPU build below. The build
# has no GPU: the driver's libcuda comes from the toolkit's stubs for the check.
COPY docker/g++-cxx17 /usr/local/bin/
RUN CXX=/usr/local/bin/g++-cxx17 HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED \
    HOROVOD_CUDA_HOME=/usr/local/cuda HOROVOD_BUILD_CUDA_CC_LIST="80,86,89,90" \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 MAKEFLAGS="-j$(nproc)" \
    pip install --no-build-isolation --no-deps --require-hashes -r requirements/horovod.lock \
 && LD_LIBRARY_PATH=/usr/local/cuda/lib64/stubs horovodrun --check-build | tee /tmp/horovod-build.txt \
 && grep -q "\[X\] NCCL" /tmp/horovod-build.txt

# ------------------------------------------------------------------------------------ trainer (GPU)
FROM nvidia/cuda:${CUDA_IMAGE_VERSION}-runtime-${CUDA_UBUNTU} AS trainer-cuda
LABEL org.opencontainers.image.title="gpt2bench" \
      org.opencontainers.image.description="GPT-2 data-parallel strategy benchmark: trainer for NVIDIA GPUs" \
      org.opencontainers.image.source="https://github.com/gpt2bench/gpt2bench" \
      org.opencontainers.image.licenses="Apache-2.0"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Python, Open MPI, OpenSSH and NCCL (the runtime of what Horovod was built against).
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3.12 openmpi-bin \
      libopenmpi3t64 openssh-server openssh-client libgomp1 libnccl2 \
 && rm -rf /var/lib/apt/lists/*
# Fabrics (docs/clusters.md). rdma-core's verbs library and its providers: NCCL's own IB transport (InfiniBand,
# RoCE) loads libibverbs at run time and falls back to sockets without it. EFA (AWS): build the variant with
# --build-arg EFA_INSTALLER_VERSION=<version> (e.g. 1.43.1; tag it -cuda-efa): AWS's installer puts libfabric
# and aws-ofi-nccl, NCCL's net plugin for EFA, under /opt/amazon, which LD_LIBRARY_PATH names (absent folders
# are skipped, so the plain image is unchanged).
ARG EFA_INSTALLER_VERSION=""
# hadolint ignore=DL3003,DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libibverbs1 ibverbs-providers \
 && if [ -n "${EFA_INSTALLER_VERSION}" ]; then \
      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends curl ca-certificates \
      && curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
         | tar -xz -C /tmp \
      && cd /tmp/aws-efa-installer && ./efa_installer.sh -y -g -d --skip-kmod --skip-limit-conf --no-verify \
      && cd / && rm -rf /tmp/aws-efa-installer; \
    fi \
 && rm -rf /var/lib/apt/lists/*
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:${LD_LIBRARY_PATH}
COPY docker/trainer-user.sh /usr/local/bin/
RUN trainer-user.sh
COPY --from=cuda-build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
USER 1000:1000
WORKDIR /home/gpt2bench
ENTRYPOINT ["gpt2bench"]
CMD ["--help"]

# -------------------------------------------------------------------------------------- CPU build
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ARG TORCH_VERSION
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG HOROVOD_VERSION
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Compilers and MPI headers for Horovod; Debian's cmake 3.x (cmake 4 rejects Horovod's bundled gloo).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ make cmake libopenmpi-dev openmpi-bin \
 && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv \
 && pip install "setuptools==80.9.0" "wheel==0.45.1" \
 && pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

# The rest from PyPI, every file pinned by its hash (requirements/trainer.lock); then the project itself
# (not editable), whose dependencies `pip check` finds satisfied.
WORKDIR /src
COPY requirements/trainer.lock requirements/horovod.lock requirements/
RUN pip install --no-deps --require-hashes -r requirements/trainer.lock
COPY pyproject.toml README.md ./
COPY gpt2bench/ gpt2bench/
COPY trainer/ trainer/
COPY operator/ operator/
RUN pip install --no-deps --no-build-isolation . && pip check && gpt2bench --version

# Horovod 0.28.1 needs a C++17 compile against torch's headers: docker/g++-cxx17 says why.
COPY docker/g++-cxx17 /usr/local/bin/
RUN CXX=/usr/local/bin/g++-cxx17 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 MAKEFLAGS="-j$(nproc)" \
    pip install --no-build-isolation --no-deps --require-hashes -r requirements/horovod.lock \
 && horovodrun --check-build

# ------------------------------------------------------------------------------- trainer (CPU; default)
FROM python:${PYTHON_VERSION}-slim-bookworm AS trainer
LABEL org.opencontainers.image.title="gpt2bench" \
      org.opencontainers.image.description="GPT-2 data-parallel strategy benchmark: trainer (CPU), Horovod" \
      org.opencontainers.image.source="https://github.com/gpt2bench/gpt2bench" \
      org.opencontainers.image.licenses="Apache-2.0"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Open MPI (MPIJob launchers run mpirun) and OpenSSH (mpirun reaches MPIJob workers over ssh);
# libgomp for torch's CPU kernels.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends openmpi-bin libopenmpi3 openssh-server openssh-client libgomp1 \
 && rm -rf /var/lib/apt/lists/*
COPY docker/trainer-user.sh /usr/local/bin/
RUN trainer-user.sh
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1

USER 1000:1000
WORKDIR /home/gpt2bench
ENTRYPOINT ["gpt2bench"]
CMD ["--help"]
