"""`gpt2bench run` of a TrainJob benchmark with resource claims: its TrainJob names the benchmark's own
TrainingRuntime (render_run), which the local runner resolves from what is rendered with the run. No DRA driver
runs here, so the claims are not honoured (as a device plugin's resources are not): said once, and the run goes.

Budget (2 shared cores): one run of the tiny model for 3 steps, two torchrun "nodes", about 30 s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import free_port, narrowed
from test_run_local_trainjob import run_locally

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "manifests" / "examples" / "cpu-sweep.yaml"


@pytest.mark.slow
def test_a_trainjob_with_claims_runs_locally_on_its_own_runtime_and_says_the_claims_are_not_allocated(
        tmp_path, fork_server):
    document = narrowed(yaml.safe_load(EXAMPLE.read_text()))
    document["metadata"]["name"] = "tj-dra"
    spec = document["spec"]
    spec["backend"] = "trainjob"
    spec["metrics"] = {"port": free_port()}
    spec.setdefault("pods", {})["resourceClaims"] = [{"name": "efa", "resourceClaimTemplateName": "efa-all"}]
    spec["sweep"] = {"strategies": [{"name": "ddp"}], "precisions": ["fp32"], "repeats": 1,
                     "scales": [{"nodes": 2, "processesPerNode": 1}]}
    spec["training"] |= {"seqLen": 32, "microBatchSize": 2}
    spec["data"]["maxDocuments"] = 12
    done, out = run_locally(tmp_path, document, fork_server)
    assert done.stdout.count("spec.pods.resourceClaims (efa) are not allocated here") == 1, done.stdout
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert (run["jobKind"], run["phase"]) == ("TrainJob", "Succeeded"), run
    assert run["results"]["worldSize"] == 2
    job = yaml.safe_load((out / run["runDir"] / "job.yaml").read_text())
    assert job["spec"]["runtimeRef"]["kind"] == "TrainingRuntime"
