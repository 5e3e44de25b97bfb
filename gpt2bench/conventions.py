"""What the stages agree on, defined once: environment variables, files, the summary marker, labels,
container names and job API versions.

Every producer and consumer imports these names from here, so dependencies point one way: the trainer
and the local runner never import the operator, the renderer or the collector for a constant.
"""

from __future__ import annotations

# ------------------------------------------------------------------ where the trainer writes
OUTPUT_ENV = "GPT2BENCH_OUTPUT_DIR"  # folder for steps.jsonl and summary.json (a pod's emptyDir)
OUTPUT_DIR = "/var/run/gpt2bench/output"  # its mount path in a pod
STEPS_FILE = "steps.jsonl"
SUMMARY_FILE = "summary.json"
# The container's termination message: where the operator reads a run's result from the result pod.
TERMINATION_LOG_ENV = "GPT2BENCH_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
MAX_TERMINATION_MESSAGE = 4096  # the kubelet keeps at most 4096 bytes of a termination message
# The trainer's last stdout line: `GPT2BENCH_SUMMARY {compact json}` (collect and launch look for it).
SUMMARY_PREFIX = "GPT2BENCH_SUMMARY "
# Just before it, the per-step curves: `GPT2BENCH_STEPS <base64 of gzip of a JSON object of columns>`, one
# line of at most MAX_STEPS_LINE characters (steps are thinned evenly, the last one kept, until it fits). The
# operator reads it from the result pod's log into a ConfigMap, so that the curves outlive the pods.
STEPS_PREFIX = "GPT2BENCH_STEPS "
MAX_STEPS_LINE = 16_000  # below the 16 KiB at which container runtimes split a log line
STEPS_COLUMNS = ("step", "warmup", "loss", "grad_norm", "lr", "step_seconds", "tokens_per_second")
MAX_STEPS_JSON = 1_000_000  # decoded size limit: what a ConfigMap can hold
# Where the operator keeps them: a ConfigMap `<run>-steps` per run, owned by the GPT2Benchmark, labelled
# with the benchmark and run labels and `app.kubernetes.io/component: steps`, key `steps.jsonl`.
STEPS_COMPONENT = "steps"
STEPS_CONFIGMAP_KEY = "steps.jsonl"
STEPS_CONFIGMAP_SUFFIX = "-steps"

# The CPU budget of one training pod, in cores (decimal): its CPU limit, else its request (render/pods.py); on one
# machine, its share of the machine (local/executor.py). Every rank sets its intra-op threads to its share of it
# (trainer/devices.py, cpu_budget), whatever launched it: torchrun sets OMP_NUM_THREADS=1, mpirun nothing.
POD_CPUS_ENV = "GPT2BENCH_POD_CPUS"
# The node a pod runs on (the downward API's spec.nodeName, render/pods.py); every rank records it in its payload, so
# that the summary says on which nodes a run ran (`node_names`, `nodes_used`). MPI ranks started over ssh get it from
# their pod's sshd (`-o SetEnv`), not from mpirun, which would forward the launcher's.
NODE_NAME_ENV = "GPT2BENCH_NODE_NAME"

# What a run asks of its fabric (spec.fabric, render/pods.py; read by trainer/fabric.py, forwarded by mpirun to every
# rank): `rdma` makes every rank check at start that it can register memory for RDMA and sees an RDMA device, and
# stop at once with the node-level fix when it cannot; `none` lets a multi-node GPU run whose NCCL fell back to
# sockets go on (a socket baseline); unset is `auto`: such a run stops after its first step. GPUDIRECT_RDMA_ENV=1
# also stops a multi-node run whose network channels did not move GPU memory directly. NCCL_ENV_SCRIPT_ENV: a
# shell script of `export NCCL_...=...` lines the node provides (gIB's set_nccl_env.sh), sourced by every rank
# before NCCL starts.
FABRIC_ENV = "GPT2BENCH_FABRIC"
GPUDIRECT_RDMA_ENV = "GPT2BENCH_GPUDIRECT_RDMA"
NCCL_ENV_SCRIPT_ENV = "GPT2BENCH_NCCL_ENV_SCRIPT"

# ------------------------------------------------------------------ what only the local runner sets (not in pods)
# The address the trainer's metrics server binds: unset in a pod (every address, 0.0.0.0, for Prometheus to scrape
# the pod); the local runner sets loopback, so a laptop's trainers do not serve their metrics to its network.
METRICS_ADDRESS_ENV = "GPT2BENCH_METRICS_ADDRESS"
DEFAULT_METRICS_ADDRESS = "0.0.0.0"  # noqa: S104 (a pod's metrics are scraped from outside it)
# The pid of the `gpt2bench run` that started the replica: every `gpt2bench train` under it (torchrun's workers,
# mpirun's ranks) stops when that process is gone, however it ended (trainer/lifeline.py).
RUNNER_PID_ENV = "GPT2BENCH_RUNNER_PID"
# The socket of the local runner's fork server (gpt2bench/local/forkserver.py): a `gpt2bench train`, `gpt2bench
# launch` or torchrun started under the runner asks it for a process that has torch and transformers imported
# already. Unset in a pod. `GPT2BENCH_FORKSERVER=off` in the runner's environment turns the server off.
FORKSERVER_ENV = "GPT2BENCH_FORKSERVER_SOCKET"
FORKSERVER_SWITCH_ENV = "GPT2BENCH_FORKSERVER"
FORKED_COMMANDS = ("train", "launch")  # the `gpt2bench` commands that ask the fork server themselves (gpt2bench.cli)

# ------------------------------------------------------------------ the jobs a run becomes
PYTORCHJOB_API = "kubeflow.org/v1"
MPIJOB_API = "kubeflow.org/v2beta1"
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"  # Kubeflow Trainer v2
# Container names: the training operator finds the PyTorchJob's container by the name `pytorch`.
PYTORCH_CONTAINER = "pytorch"
LAUNCHER_CONTAINER = "launcher"
WORKER_CONTAINER = "worker"
# Trainer v2's plugins only touch containers named `node` (the trainer's, and an MPI launcher's too).
TRAINJOB_CONTAINER = "node"

# ------------------------------------------------------------------ the trainer image and its pods
# The image's non-root user (Dockerfile: `useradd --uid 1000 gpt2bench`); every rendered pod runs as it.
TRAINER_UID = 1000
TRAINER_HOME = "/home/gpt2bench"
# MPIJob workers run sshd as that user, unprivileged port (mpi-operator's non-root mode).
SSH_PORT = 2222
# The operator's default trainer images by device type (`gpt2bench operator --trainer-image-cpu/-gpu`).
TRAINER_IMAGE_CPU_ENV = "GPT2BENCH_TRAINER_IMAGE_CPU"
TRAINER_IMAGE_GPU_ENV = "GPT2BENCH_TRAINER_IMAGE_GPU"

# ------------------------------------------------------------------ labels on jobs and pods
BENCHMARK_LABEL = "gpt2bench.io/benchmark"
RUN_LABEL = "gpt2bench.io/run"
STRATEGY_LABEL = "gpt2bench.io/strategy"
PRECISION_LABEL = "gpt2bench.io/precision"
# On the pods that train (not an MPIJob's launcher): what a run's spread across nodes selects (render/pods.py).
ROLE_LABEL = "gpt2bench.io/role"
TRAINER_ROLE = "trainer"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# On a TrainJob: which of its replicated jobs' pod 0 holds the trainer's summary (`node` or `launcher`).
RESULT_REPLICATED_JOB_ANNOTATION = "gpt2bench.io/result-replicated-job"
# On a TrainJob whose benchmark asks for gang scheduling (`required`): its runtime must have a podGroupPolicy
# (the operator refuses the run otherwise); Trainer v2's Volcano plugin reads the queue from this annotation.
GANG_ANNOTATION = "gpt2bench.io/gang-scheduling"
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpt2bench-operator"
COMPONENT_LABEL = "app.kubernetes.io/component"
