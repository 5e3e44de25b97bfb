# syntax=docker/dockerfile:1
# gpt2bench: one image for the operator (`gpt2bench operator`), the trainer (`torchrun … gpt2bench train`)
# and MPIJob launchers/workers (`mpirun`, sshd, Horovod).
#
#   docker build -t gpt2bench:dev .                          # CPU torch (the default; runs the CPU example)
#   docker build -t gpt2bench:cu128 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
#
# GPU note: torch's CUDA wheels carry their own CUDA runtime and NCCL, so DDP/FSDP on GPUs need only the
# NVIDIA driver and device plugin on the node. Horovod is built here with Gloo + MPI for CPU tensors; for
# NCCL GPU all-reduce, build it on nvidia/cuda:*-devel with HOROVOD_GPU_OPERATIONS=NCCL.

ARG PYTHON_VERSION=3.11

# ---------------------------------------------------------------------------------------------- build
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG HOROVOD_VERSION=0.28.1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Compilers and MPI headers for Horovod; Debian's cmake 3.x (cmake 4 rejects Horovod's bundled gloo).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ make cmake libopenmpi-dev openmpi-bin \
 && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv \
 && pip install "setuptools==75.8.0" "wheel==0.45.1" \
 && pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

# The project itself (not editable); torch is already satisfied, the rest comes from PyPI.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpt2bench/ gpt2bench/
COPY trainer/ trainer/
COPY operator/ operator/
RUN pip install . && gpt2bench --version

# Horovod 0.28.1 pins -std=c++14, but torch >= 2.1 headers need C++17 ('std::optional' has not been
# declared): compile through a g++ wrapper that rewrites -std=c++11/14 to c++17 (as scripts/install.sh).
# The single quotes are meant: "$@" and "$a" belong to the wrapper script, not to this shell.
# hadolint ignore=SC2016
RUN printf '%s\n' '#!/bin/sh' \
      'for a do shift; case "$a" in -std=c++11|-std=c++14) set -- "$@" -std=c++17 ;; *) set -- "$@" "$a" ;; esac; done' \
      'exec /usr/bin/g++ "$@"' > /usr/local/bin/g++-cxx17 \
 && chmod +x /usr/local/bin/g++-cxx17 \
 && CXX=/usr/local/bin/g++-cxx17 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 MAKEFLAGS="-j$(nproc)" \
    pip install --no-build-isolation "horovod==${HOROVOD_VERSION}" \
 && horovodrun --check-build

# -------------------------------------------------------------------------------------------- runtime
FROM python:${PYTHON_VERSION}-slim-bookworm
LABEL org.opencontainers.image.title="gpt2bench" \
      org.opencontainers.image.description="GPT-2 data-parallel strategy benchmark: operator, trainer, Horovod" \
      org.opencontainers.image.source="https://github.com/gpt2bench/gpt2bench" \
      org.opencontainers.image.licenses="Apache-2.0"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Open MPI (MPIJob launchers run mpirun) and OpenSSH (mpirun reaches MPIJob workers over ssh);
# libgomp for torch's CPU kernels.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends openmpi-bin libopenmpi3 openssh-server openssh-client libgomp1 \
 && rm -rf /var/lib/apt/lists/*

# sshd for MPIJob workers. The mpi-operator mounts the job's key pair and authorized_keys at
# sshAuthMountPath; that key is also the host key, so no private host key is baked into the image.
# Root mode (what gpt2bench render uses today: sshAuthMountPath /root/.ssh, `sshd -De`, pods running as
# uid 0) uses /etc/ssh/sshd_config; non-root mode (uid 1000, sshAuthMountPath /home/gpt2bench/.ssh) runs
# `sshd -De -f /home/gpt2bench/.sshd_config` on port 2222, as the mpi-operator's base image does.
RUN rm -f /etc/ssh/ssh_host_*_key* \
 && mkdir -p /run/sshd \
 && sed -i 's/[ #]\(.*StrictHostKeyChecking \).*/ \1no/' /etc/ssh/ssh_config \
 && echo '    UserKnownHostsFile /dev/null' >> /etc/ssh/ssh_config \
 && sed -i 's/#\(StrictModes \).*/\1no/' /etc/ssh/sshd_config \
 && echo 'HostKey /root/.ssh/id_rsa' >> /etc/ssh/sshd_config \
 && useradd --create-home --uid 1000 --user-group --shell /bin/bash gpt2bench \
 && printf '%s\n' 'Port 2222' 'PidFile /home/gpt2bench/sshd.pid' 'HostKey /home/gpt2bench/.ssh/id_rsa' \
      'StrictModes no' > /home/gpt2bench/.sshd_config \
 && chown gpt2bench:gpt2bench /home/gpt2bench/.sshd_config

COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Non-root by default (operator, PyTorchJob replicas); MPIJob pods in root mode set runAsUser: 0.
USER 1000:1000
WORKDIR /home/gpt2bench
ENTRYPOINT ["gpt2bench"]
CMD ["--help"]
