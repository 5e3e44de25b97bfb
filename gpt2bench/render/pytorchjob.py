"""A run as a PyTorchJob (kubeflow.org/v1): Master (node rank 0) + Workers, each running torchrun."""

from __future__ import annotations

import copy
from typing import Any

from gpt2bench.conventions import PYTORCH_CONTAINER, PYTORCHJOB_API
from gpt2bench.render.pods import RunPods

# The training operator's default rendezvous port; named so that it never guesses.
PYTORCHJOB_PORT = 23456


def render_pytorchjob(pods: RunPods) -> dict[str, Any]:
    run = pods.run
    # "--" ends torchrun's own options: without it argparse's prefix matching takes the trainer's
    # `--run NAME` for torchrun's `--run-path` and fails as ambiguous.
    command = ["torchrun", "--no-python", "--", "gpt2bench", "train", *run.trainer_args()]
    container = {
        "name": PYTORCH_CONTAINER,
        "command": command,
        "env": pods.env,
        "ports": [{"name": "pytorchjob-port", "containerPort": PYTORCHJOB_PORT, "protocol": "TCP"}],
    }
    replica = {"restartPolicy": pods.restart_policy, "template": pods.template(container)}
    replicas = {"Master": {"replicas": 1, **copy.deepcopy(replica)}}
    if run.nodes > 1:
        replicas["Worker"] = {"replicas": run.nodes - 1, **copy.deepcopy(replica)}
    return {
        "apiVersion": PYTORCHJOB_API,
        "kind": "PyTorchJob",
        "metadata": pods.metadata,
        "spec": {
            # Without it the operator's WORLD_SIZE counts pods, not processes.
            "nprocPerNode": str(run.procs_per_node),
            "runPolicy": pods.run_policy(min_available=run.nodes),
            "pytorchReplicaSpecs": replicas,
        },
    }
