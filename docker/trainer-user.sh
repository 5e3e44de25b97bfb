#!/bin/sh
# The trainer images' user and sshd, shared by the CPU (Debian) and CUDA (Ubuntu) trainer stages.
#
# Every rendered pod runs as uid 1000 (Pod Security "restricted"). MPIJob workers run sshd as that user, as
# mpi-operator's non-root mode does: mpi-operator mounts the job's key pair and authorized_keys at
# sshAuthMountPath (/home/gpt2bench/.ssh), that key is also the host key (no private key is baked into the
# image), and sshd listens on 2222 (a user may not bind below 1024 once every capability is dropped). Its pid
# file goes to /tmp: the pods' root filesystem is read-only, /tmp an emptyDir (gpt2bench/render/pods.py).
set -eu
# Ubuntu 24.04 images ship a user `ubuntu` with uid 1000.
if id -u ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi
useradd --create-home --uid 1000 --user-group --shell /bin/bash gpt2bench
rm -f /etc/ssh/ssh_host_*_key*
mkdir -p /run/sshd
printf '%s\n' 'Port 2222' 'PidFile /tmp/sshd.pid' 'HostKey /home/gpt2bench/.ssh/id_rsa' \
  'StrictModes no' > /home/gpt2bench/.sshd_config
chown gpt2bench:gpt2bench /home/gpt2bench/.sshd_config
# The client (mpirun's ssh): workers' host keys are per job, so none is known in advance; port 2222.
printf '%s\n' 'Host *' '    StrictHostKeyChecking no' '    UserKnownHostsFile /dev/null' '    Port 2222' \
  > /etc/ssh/ssh_config.d/gpt2bench.conf
