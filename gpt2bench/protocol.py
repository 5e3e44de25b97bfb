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

# ------------------------------------------------------------------ labels on jobs and pods
BENCHMARK_LABEL = "gpt2bench.io/benchmark"
RUN_LABEL = "gpt2bench.io/run"
STRATEGY_LABEL = "gpt2bench.io/strategy"
PRECISION_LABEL = "gpt2bench.io/precision"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# On a TrainJob: which of its replicated jobs' pod 0 holds the trainer's summary (`node` or `launcher`).
RESULT_REPLICATED_JOB_ANNOTATION = "gpt2bench.io/result-replicated-job"
