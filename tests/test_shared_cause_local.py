"""One cause, one stop, locally: `gpt2bench run`'s sweep holds the runs that share an environment's
cause, the others go on, and `--resume` runs the held ones once the user has fixed it. The rule is the operator's
(`gpt2bench.diagnosis.holds`; tests/test_shared_cause_operator.py). The replicas are real processes of the local
executor, each rendered job's command replaced by a few lines that end as a trainer would (its summary in the
termination-message file, its reason on stderr), so no training runs."""

from __future__ import annotations

import json
import sys

import pytest
from fault_figures import FIGURES
from kube.fixtures import benchmark
from kube.training import trainer_summary

from gpt2bench.local import sweep as local_sweep
from gpt2bench.plan import plan_runs
from gpt2bench.render import render_job
from gpt2bench.specification.validation import load_benchmark

pytestmark = pytest.mark.timeout(120)

SOCKETS = ("NCCL reached the other nodes over sockets (NET/Socket) on 2 of 2 ranks, not over the cluster's fabric: "
           "stopped after the first step instead of measuring the wrong network (spec.fabric.require auto; `none` "
           "runs a socket baseline on purpose). docs/clusters.md says what each cluster's fabric needs")
SCALES = [{"nodes": 2, "devicesPerNode": 0, "processesPerNode": 1},
          {"nodes": 3, "devicesPerNode": 0, "processesPerNode": 1},
          {"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2}]


def ends(summary: dict, code: int) -> list[str]:
    """A replica command that writes `summary` as the trainer's termination message and exits with `code`."""
    script = (f"import json, os, sys; open(os.environ['GPT2BENCH_TERMINATION_LOG'], 'w').write({json.dumps(summary)!r});"
              f" sys.stderr.write('gpt2bench train: error: ' + {summary.get('reason', '')!r} + '\\n' if {code} else '');"
              f" sys.exit({code})")
    return [sys.executable, "-c", script]


def jobs_for(bench, runs, fabric_broken: bool) -> list[dict]:
    jobs = []
    for run in runs:
        job = render_job(bench, run)
        broken = fabric_broken and run.nodes > 1
        summary = {"status": "failed", "reason": SOCKETS} if broken else trainer_summary(run.name, 100.0 + run.nodes)
        for replica, spec in job["spec"]["pytorchReplicaSpecs"].items():
            container = spec["template"]["spec"]["containers"][0]
            container.pop("args", None)
            container["command"] = ends(summary, 1 if broken else 0) if replica == "Master" else \
                [sys.executable, "-c", "pass"]
        jobs.append(job)
    return jobs


def first_run_fails(tmp_path, name: str, reason: str):
    """A sweep of SCALES whose first run fails with `reason` and whose others succeed: its results document."""
    document = benchmark(name, [{"name": "ddp"}])
    document["spec"]["sweep"]["scales"] = SCALES
    bench = load_benchmark(document)
    runs = plan_runs(bench)
    jobs = jobs_for(bench, runs, fabric_broken=False)
    jobs[0]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"] = ends(
        {"status": "failed", "reason": reason}, 1)
    return local_sweep.run_sweep(bench, runs, tmp_path / "out", jobs=jobs, live=False).doc


@pytest.mark.faults
def test_a_fabric_failure_holds_the_multi_node_runs_locally_and_resume_runs_them(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2BENCH_FORKSERVER", "off")  # no trainer runs: nothing to fork from
    document = benchmark("local-fabric", [{"name": "ddp"}])
    document["spec"]["sweep"]["scales"] = SCALES
    bench = load_benchmark(document)
    runs = plan_runs(bench)
    out = tmp_path / "out"
    doc = local_sweep.run_sweep(bench, runs, out, jobs=jobs_for(bench, runs, fabric_broken=True), live=False).doc
    two, three, one = doc.runs
    assert (two.phase, three.phase, one.phase) == ("Failed", "Skipped", "Succeeded")
    assert SOCKETS in two.reason
    assert three.reason.startswith(f"held (fabric): {two.name} failed for a cause every run on 2+ nodes shares (once "
                                   f"fixed: gpt2bench run FILE --resume --output {out}, FILE GPT2Benchmark local-fabric's"
                                   " file): ")
    assert not (out / "runs" / three.name).exists()  # never started
    assert json.loads((out / "results.json").read_text())["runs"][1]["reason"] == three.reason

    chosen, resumed = local_sweep.prepare_folder(bench, runs, runs, out, resume=True)  # the user fixed the fabric
    assert [run.name for run in chosen] == [run.name for run in runs] and set(resumed.kept) == {two.name, one.name}
    doc = local_sweep.run_sweep(bench, chosen, out, jobs=jobs_for(bench, chosen, fabric_broken=False), live=False,
                                resumed=resumed).doc
    assert [run.phase for run in doc.runs] == ["Failed", "Succeeded", "Succeeded"]
    assert doc.runs[0].reason == two.reason and doc.runs[1].reason is None
    FIGURES["shared-cause-fabric-local"] = {"injected": 1, "runs_held": 1, "single_node_runs_went_on": 1,
                                            "resumed_runs_succeeded": 1, "runs_lost": 0, "held_reason": three.reason}


def test_a_failure_of_the_runs_own_holds_nothing_locally(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2BENCH_FORKSERVER", "off")
    doc = first_run_fails(tmp_path, "local-own", "loss is NaN at step 3")
    assert [run.phase for run in doc.runs] == ["Failed", "Succeeded", "Succeeded"]


def test_a_run_that_met_a_full_disk_holds_every_run_after_it_locally(tmp_path, monkeypatch):
    """A trainer that could not write its records (ENOSPC) while the runner's own writes still work: the disk is
    the sweep's, so the runs after it are held (Skipped, resumable) instead of each failing the same way."""
    monkeypatch.setenv("GPT2BENCH_FORKSERVER", "off")
    doc = first_run_fails(tmp_path, "local-disk", "OSError: [Errno 28] No space left on device: 'steps.jsonl'")
    assert [run.phase for run in doc.runs] == ["Failed", "Skipped", "Skipped"]
    assert all(run.reason.startswith(f"held (disk): {doc.runs[0].name} failed for a cause every run shares")
               for run in doc.runs[1:])
