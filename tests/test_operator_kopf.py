"""The real kopf operator (kopf.testing.KopfRunner) against the emulated API over HTTP.

The test plays the Kubeflow operators (job conditions, result pods with termination messages) and
drives the GPT2Benchmarks with kubectl and the `kubernetes` client.
"""

from __future__ import annotations

import json
import math
import statistics
import time

import kubernetes
import pytest
import yaml
from kube.fixtures import (
    REPO,
    benchmark,
    kubectl_table,
    operator_calls,
    wait_for,
)
from kube.training import TrainingOperator, trainer_summary

pytestmark = pytest.mark.timeout(120)
TERMINAL = ("Succeeded", "Failed")


DRIFT = {1: 1.01, 2: 0.99, 3: 1.0}  # a round's shared effect on every run's tokens/s




def _finished(job: dict) -> bool:
    return any(c["type"] in TERMINAL and c["status"] == "True" for c in (job.get("status") or {}).get("conditions", []))


def play(trainer: TrainingOperator, name: str, total: int, outcome, max_active: int = 1) -> list[str]:
    """Finish every job of a sweep as it appears; check no more than `max_active` are ever unfinished."""
    done: list[str] = []
    while len(done) < total:
        jobs = wait_for(lambda: [j for j in trainer.jobs(name) if not _finished(j)], 15,
                        what=f"the next job of {name} (done: {done})")
        assert len(jobs) <= max_active, f"{[j['metadata']['name'] for j in jobs]} unfinished at once"
        job = jobs[0]
        trainer.start(job)
        outcome(trainer, job, len(done))
        done.append(job["metadata"]["name"])
    return done


def test_cpu_example_sweeps_to_succeeded_with_the_status_table(cluster, benchmarks, trainer, tmp_path):
    example = yaml.safe_load((REPO / "manifests" / "examples" / "cpu-sweep.yaml").read_text())
    for key in ("maxRepeats", "minEffect", "budget"):  # its 2 rounds only: adding rounds has its own test below
        example["spec"]["sweep"].pop(key)
    (tmp_path / "cpu-sweep.yaml").write_text(yaml.safe_dump(example))
    applied = cluster.kubectl("apply", "-f", str(tmp_path / "cpu-sweep.yaml"))
    assert "gpt2benchmark.gpt2bench.io/cpu-sweep created" in applied.stdout
    total = wait_for(lambda: benchmarks.status("cpu-sweep").get("runsTotal"), what="runsTotal")
    assert total == 40  # 5 strategies x 2 precisions x (the breakdown round + 3 repeats)

    order = play(trainer, "cpu-sweep", total, lambda t, job, i: t.succeed(job, 1000.0 + 10 * i))

    status = wait_for(lambda: (s := benchmarks.status("cpu-sweep")).get("phase") == "Succeeded" and s,
                      what="phase Succeeded")
    runs = status["runs"]
    assert [r["name"] for r in runs] == order, "runs start in plan order, one at a time"
    assert status["runsDone"] == status["runsSucceeded"] == 40 and status["runsFailed"] == 0
    assert all(r["phase"] == "Succeeded" and r["results"]["tokensPerSecond"] > 0 for r in runs)
    assert {r["jobKind"] for r in runs} == {"PyTorchJob", "MPIJob"}
    decision_runs = {}  # the best configuration: the highest geometric mean over its rounds (the breakdown round's
    for i, name in enumerate(order):  # runs left out), as the report's tables give it
        if not name.endswith("-prof"):
            decision_runs.setdefault(name.rsplit("-r", 1)[0], []).append(1000.0 + 10 * i)
    best = max(decision_runs, key=lambda c: math.prod(decision_runs[c]))
    assert status["best"]["run"] == best and status["best"]["tokensPerSecond"] == pytest.approx(
        math.prod(decision_runs[best]) ** (1 / len(decision_runs[best])))
    assert status["completionTime"] >= status["startTime"]
    assert status["observedGeneration"] == 1
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in status["conditions"])

    table = cluster.kubectl("get", "gpt2benchmark", "cpu-sweep").stdout.split()
    assert table[:9] == ["NAME", "PHASE", "DONE", "RUNS", "RACING", "RECOMMENDED", "DECISION", "AGE", "WAITING"]
    # the race's one look after its 3 fixed rounds: the column says what status.analysis says, nothing races on
    assert table[9:14] == ["cpu-sweep", "Succeeded", "40", "40", "0"]
    assert status["analysis"]["recommended"]["decision"] in table[14:16]
    as_yaml = yaml.safe_load(cluster.kubectl("get", "g2b", "cpu-sweep", "-o", "yaml").stdout)
    assert as_yaml["status"]["runs"] == runs

    benchmarks.posted("cpu-sweep", "SweepSucceeded")  # the last Event: every other one is posted before it
    reasons = [e["reason"] for e in benchmarks.events("cpu-sweep")]
    assert reasons.count("RunStarted") == 40 and reasons.count("RunSucceeded") == 40
    assert "SweepPlanned" in reasons and "SweepSucceeded" in reasons

    uid = benchmarks.get("cpu-sweep")["metadata"]["uid"]
    for job in trainer.jobs("cpu-sweep"):
        owners = job["metadata"]["ownerReferences"]
        assert [(o["kind"], o["uid"], o.get("controller")) for o in owners] == [("GPT2Benchmark", uid, True)]
        assert job["metadata"]["labels"]["gpt2bench.io/run"] == job["metadata"]["name"]


def test_a_two_scale_sweep_puts_recommendation_scaling_and_findings_in_status(cluster, benchmarks, trainer, tmp_path):
    """1 and 2 processes, ddp and fsdp: the operator's status carries the analysis (docs/analysis.md),
    `kubectl get` shows the recommended run, and `gpt2bench report --cluster` reads the same answer back."""
    sweep = {"strategies": [{"name": "ddp"}, {"name": "fsdp"}], "repeats": 3, "breakdown": "inline",
             "scales": [{"nodes": 1, "devicesPerNode": 0, "processesPerNode": n} for n in (1, 2)]}
    benchmarks.create(benchmark("scales", sweep=sweep, cost={"nodeHour": 0.36, "currency": "EUR"}))
    # run -> (tokens/s, workers, model state per rank)
    figures = {"scales-ddp-fp32-1x1": (1000.0, 1, 80e6), "scales-fsdp-fp32-1x1": (900.0, 1, 80e6),
               "scales-ddp-fp32-1x2": (1990.0, 2, 80e6), "scales-fsdp-fp32-1x2": (1500.0, 2, 40e6)}

    def outcome(t: TrainingOperator, job: dict, i: int) -> None:
        name = job["metadata"]["name"]
        configuration, repeat = name.rsplit("-r", 1)
        tps, workers, state = figures[configuration]
        tps *= DRIFT[int(repeat)]  # what every run of a round shares
        summary = trainer_summary(name, tps, worldSize=workers, tokensPerSecondPerDevice=tps / workers,
                                  stateBytes=state, firstLoss=10.9)
        t.finish(job, succeeded=True, message=json.dumps(summary))

    play(trainer, "scales", 12, outcome)
    status = wait_for(lambda: (s := benchmarks.status("scales")).get("phase") == "Succeeded" and s, what="Succeeded")
    analysis = status["analysis"]
    # every configuration ran 1 % faster in round 1 and 1 % slower in round 2: a drift every configuration of the
    # round shared, so the within-round ratios do not move: the race's one look (3 fixed rounds) drops fsdp with
    # the margin itself as its interval (which covers 95 %: two entrants, each comparison at 2.5 %), and names ddp
    # the fastest (error rate ≤ 5 %)
    gm = math.prod(DRIFT.values()) ** (1 / 3)
    top, runner = 1990 * gm, 1500 * gm  # geometric means
    recommended = analysis["recommended"]
    assert recommended | {"excluded": None} == {
        "objective": "fastest", "scale": "1×2 CPU", "decision": "clear", "winner": "scales-ddp-fp32-1x2",
        "verdict": "ddp fp32 is the fastest (error rate ≤ 5 %)",
        "run": "scales-ddp-fp32-1x2", "strategy": "ddp", "precision": "fp32", "value": pytest.approx(top),
        "unit": "tokens/s", "measurements": 3, "spread": pytest.approx(statistics.stdev(map(math.log, DRIFT.values()))),
        "runnerUp": "scales-fsdp-fp32-1x2", "runnerUpValue": pytest.approx(runner),
        "margin": pytest.approx(top / runner - 1), "marginLow": pytest.approx(top / runner - 1, abs=1e-9),
        "marginHigh": pytest.approx(top / runner - 1, abs=1e-9), "confidence": 0.95, "noiseDf": 2, "paired": True,
        "intervalCoverage": pytest.approx(0.95),
        "decidedIn": 3, "excluded": None,
        "dropped": [{"configuration": "scales-fsdp-fp32-1x2", "round": 3, "behind": "scales-ddp-fp32-1x2",
                     "ratio": pytest.approx(1990 / 1500), "low": pytest.approx(1990 / 1500)}]}
    assert [(s["strategy"], s["scale"], s["efficiency"]) for s in analysis["scaling"]] == [
        ("ddp", "1×1 CPU", 1.0), ("ddp", "1×2 CPU", pytest.approx(0.995)), ("fsdp", "1×1 CPU", 1.0),
        ("fsdp", "1×2 CPU", pytest.approx(750 / 900))]
    cheapest = next(r for r in analysis["recommendations"] if r["objective"] == "cheapest" and "scale" not in r)
    # both scales are one pod (node) at 0.36 EUR/h: the faster one costs less per token
    assert cheapest["winner"] == "scales-ddp-fp32-1x2"
    # the price over the geometric mean of 1990 ± 1 % tokens/s
    assert cheapest["value"] == pytest.approx(0.36 / 3600 * 1e6 / top)
    verdicts = {f["id"]: f["verdict"] for f in analysis["findings"]}
    assert verdicts == {"fsdp-memory-below-ddp": "not-measurable",  # on CPU the model state is accounting
                        "mixed-precision-faster": "not-measurable",
                        "ddp-mixed-precision-fastest-on-one-node": "not-measurable",
                        "horovod-most-robust-across-nodes": "not-measurable",
                        "ddp-scales-near-linearly": "holds",
                        "ddp-overlap-hides-communication": "not-measurable"}  # these summaries have no breakdown
    (converge,) = analysis["checks"]
    assert converge["verdict"] == "holds" and "final loss: no per-step records" in converge["measured"]

    table = cluster.kubectl("get", "gpt2benchmark", "scales").stdout.split()
    assert table[:9] == ["NAME", "PHASE", "DONE", "RUNS", "RACING", "RECOMMENDED", "DECISION", "AGE", "WAITING"]
    assert table[9:16] == ["scales", "Succeeded", "12", "12", "0", "scales-ddp-fp32-1x2", "clear"]
    (wide,) = kubectl_table(cluster.kubectl("get", "gpt2benchmark", "scales", "-o", "wide").stdout)
    assert (wide["BACKEND"], wide["BEST"], wide["VERDICT"]) == ("pytorchjob", "ddp", "ddp fp32 is the fastest (error rate ≤ 5 %)")
    assert float(wide["TOKENS/S"]) == pytest.approx(1990 * gm, rel=1e-3)  # the same geometric mean

    from gpt2bench.controller.metrics import REGISTRY

    info = {"namespace": "default", "benchmark": "scales", "objective": "fastest", "scale": "1×2 CPU",
            "winner": "scales-ddp-fp32-1x2", "run": "scales-ddp-fp32-1x2", "strategy": "ddp", "precision": "fp32",
            "decision": "clear"}
    assert REGISTRY.get_sample_value("gpt2bench_operator_recommendation_info", info) == 1.0
    for finding in analysis["findings"]:  # Grafana's findings table: the same verdicts as the status
        labels = {"namespace": "default", "benchmark": "scales", "finding": finding["id"], "verdict": finding["verdict"]}
        assert REGISTRY.get_sample_value("gpt2bench_operator_finding_info", labels) == 1.0

    from gpt2bench.report import cli as report_cli

    assert report_cli.main(["--cluster", "scales", "-n", "default", "--output", str(tmp_path), "--quiet"]) == 0
    markdown = (tmp_path / "results.md").read_text()
    assert "**At the largest scale measured (1×2 CPU): ddp fp32 is the fastest (error rate ≤ 5 %)**" in markdown
    assert "| ddp | fp32 | 1×2 CPU | 2 | 995 | " in markdown  # 0.995, its interval as narrow: a shared drift
    ddp_row = next(r for r in analysis["scaling"] if r["strategy"] == "ddp" and r["scale"] == "1×2 CPU")
    assert ddp_row["low"] == pytest.approx(0.995) and ddp_row["high"] == pytest.approx(0.995)

    benchmarks.delete("scales")  # its recommendation series go with it
    wait_for(lambda: REGISTRY.get_sample_value("gpt2bench_operator_recommendation_info", info) is None,
             what="the info series to be removed")


def test_concurrency_two_runs_two_jobs_at_once(benchmarks, trainer):
    strategies = [{"name": "single"}, {"name": "ddp"}, {"name": "fsdp"}]
    benchmarks.create(benchmark("par", strategies, concurrency=2))
    first = wait_for(lambda: len(jobs := trainer.jobs("par")) == 2 and jobs, what="two jobs at once")
    time.sleep(1.0)  # three timer ticks
    assert len(trainer.jobs("par")) == 2, "the third run waits for a free slot"
    play(trainer, "par", 3, lambda t, job, i: t.succeed(job, 500.0 + i), max_active=2)
    assert wait_for(lambda: benchmarks.status("par").get("phase") == "Succeeded", what="Succeeded")
    assert [j["metadata"]["name"] for j in first] == [r["name"] for r in benchmarks.status("par")["runs"][:2]]


def test_a_failing_run_is_recorded_with_its_reason_and_the_sweep_continues(benchmarks, trainer):
    strategies = [{"name": "single"}, {"name": "ddp"}, {"name": "fsdp"}]
    benchmarks.create(benchmark("flaky", strategies))

    def outcome(t: TrainingOperator, job: dict, i: int) -> None:
        if i == 1:  # the trainer itself reports why, in its summary
            summary = trainer_summary(job["metadata"]["name"], 0.0, status="failed", reason="loss is NaN at step 3")
            t.finish(job, succeeded=False, message=json.dumps(summary), condition_message="pod failed")
        else:
            t.succeed(job, 100.0 * (i + 1))

    play(trainer, "flaky", 3, outcome)
    status = wait_for(lambda: (s := benchmarks.status("flaky")).get("phase") not in (None, "Running") and s,
                      what="the sweep to finish")
    assert status["phase"] == "PartiallySucceeded"
    assert [r["phase"] for r in status["runs"]] == ["Succeeded", "Failed", "Succeeded"]
    assert status["runs"][1]["reason"] == "loss is NaN at step 3"
    assert "results" not in status["runs"][1]
    assert status["best"]["run"] == status["runs"][2]["name"] and status["runsFailed"] == 1
    failed = benchmarks.posted("flaky", "RunFailed")
    assert any(e["type"] == "Warning" and "loss is NaN" in e["message"] for e in failed)


def test_a_killed_pod_without_message_fails_with_the_container_reason(benchmarks, trainer):
    benchmarks.create(benchmark("oom", [{"name": "ddp"}]))
    play(trainer, "oom", 1, lambda t, job, i: t.finish(job, succeeded=False, message=None, exit_code=137))
    status = wait_for(lambda: (s := benchmarks.status("oom")).get("phase") == "Failed" and s, what="Failed")
    # the pod and how its container ended first, then the training operator's own words
    assert status["runs"][0]["reason"] == ("pod oom-ddp-fp32-1x2-master-0 (container pytorch) OOMKilled (exit code 137); "
                                           "PyTorchJobFailed: PyTorchJob oom-ddp-fp32-1x2 is failed because 1 Master "
                                           "replica(s) failed.")
    assert status.get("best") is None


# Rules the CRD cannot state (quantities compared, map keys, ports derived from the sweep): the API server
# stores such a benchmark, the operator refuses it. What the CRD states (CEL rules, list types) never gets
# this far: tests/test_validation_rules.py.
LOCAL_ONLY_RULES = [
    ("bad-limits", {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}},
     "spec.resources.limits.memory"),
    ("bad-selector", {"nodeSelector": {"gpu/": "a100"}}, "spec.nodeSelector[gpu/]"),
    ("bad-port", {"metrics": {"port": 65535}}, "spec.metrics.port"),
]


@pytest.mark.parametrize(("name", "spec", "field"), LOCAL_ONLY_RULES)
def test_a_malformed_benchmark_is_invalid_names_the_field_and_creates_nothing(benchmarks, trainer, name, spec, field):
    benchmarks.create(benchmark(name, **spec))
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") and s, what="a phase")
    assert status["phase"] == "Invalid"
    assert field in status["message"]
    events = wait_for(lambda: [e for e in benchmarks.events(name) if e["reason"] == "InvalidSpec"], what="Event")
    assert events[0]["type"] == "Warning" and field in events[0]["message"]
    assert trainer.jobs(name) == []


def test_fixing_an_invalid_spec_starts_the_sweep(benchmarks, trainer):
    benchmarks.create(benchmark("fixme", [{"name": "single"}],
                                resources={"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}))
    wait_for(lambda: benchmarks.status("fixme").get("phase") == "Invalid", what="Invalid")
    benchmarks.patch_spec("fixme", {"resources": {"limits": {"cpu": "2"}}})
    play(trainer, "fixme", 1, lambda t, job, i: t.succeed(job, 42.0))
    status = wait_for(lambda: (s := benchmarks.status("fixme")).get("phase") == "Succeeded" and s, what="Succeeded")
    assert status["observedGeneration"] == 2


def test_what_the_crd_states_is_refused_before_the_operator_sees_it(benchmarks, trainer):
    with pytest.raises(kubernetes.client.ApiException) as refused:
        benchmarks.create(benchmark("bad-dp", sweep={"strategies": [{"name": "dataparallel"}],
                                                     "scales": [{"nodes": 2}]}))
    assert refused.value.status == 422 and "dataparallel runs in one process" in refused.value.body
    assert not benchmarks.exists("bad-dp") and trainer.jobs("bad-dp") == []


def test_a_spec_change_after_start_is_ignored_with_a_warning(benchmarks, trainer):
    benchmarks.create(benchmark("frozen", [{"name": "single"}, {"name": "ddp"}]))
    wait_for(lambda: trainer.jobs("frozen"), what="the first job")
    benchmarks.patch_spec("frozen", {"sweep": {"strategies": [{"name": "single"}, {"name": "ddp"}, {"name": "fsdp"}]}})
    status = wait_for(lambda: (s := benchmarks.status("frozen")) and any(
        c["type"] == "SpecChangeIgnored" for c in s.get("conditions", [])) and s, what="SpecChangeIgnored")
    assert status["runsTotal"] == 2 and status["observedGeneration"] == 1
    play(trainer, "frozen", 2, lambda t, job, i: t.succeed(job, 10.0 + i))
    status = wait_for(lambda: (s := benchmarks.status("frozen")).get("phase") == "Succeeded" and s, what="Succeeded")
    assert [r["strategy"] for r in status["runs"]] == ["single", "ddp"]
    assert len(trainer.jobs("frozen")) == 2
    assert any(e["type"] == "Warning" for e in benchmarks.posted("frozen", "SpecChangeIgnored"))


def test_deleting_a_running_benchmark_lets_it_go_and_its_jobs_follow(cluster, benchmarks, trainer):
    benchmarks.create(benchmark("doomed", [{"name": "single"}, {"name": "ddp"}]))
    job = wait_for(lambda: trainer.jobs("doomed"), what="the first job")[0]
    body = benchmarks.get("doomed")
    assert not body["metadata"].get("finalizers"), "nothing holds its deletion (docs/operator.md)"
    assert job["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    cluster.kubectl("delete", "gpt2benchmark", "doomed", "--wait=false")
    wait_for(lambda: not benchmarks.exists("doomed"), what="the benchmark to be deleted")
    # the emulator garbage-collects by ownerReferences, as the API server's GC does
    wait_for(lambda: trainer.jobs("doomed") == [], what="its jobs to be collected")


def test_kubectl_patch_status_subresource_reaches_the_operator_view(cluster, benchmarks):
    benchmarks.create(benchmark("patched", [{"name": "single"}]))
    wait_for(lambda: benchmarks.status("patched").get("phase") == "Running", what="Running")
    # completionTime: a declared field the operator leaves alone while the sweep runs
    stamp = "2026-01-01T00:00:00Z"
    cluster.kubectl("patch", "gpt2benchmark", "patched", "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"completionTime": stamp, "patchedBy": "kubectl"}}))
    status = benchmarks.status("patched")
    assert status["completionTime"] == stamp
    assert "patchedBy" not in status  # undeclared: pruned, as by an API server with a structural schema
    # the main endpoint ignores status, as with a real status subresource
    cluster.kubectl("patch", "gpt2benchmark", "patched", "--type=merge", "-p",
                    json.dumps({"status": {"completionTime": "2000-01-01T00:00:00Z"}}))
    status = benchmarks.status("patched")
    assert status["completionTime"] == stamp and status["phase"] == "Running" and status["runsTotal"] == 1


def test_manifest_rbac_covers_every_call_the_operator_made(cluster, benchmarks, trainer):
    """Everything kopf and our client asked the API for in this module's runs (one more sweep here, with
    per-step curves, so that the test stands alone), checked against the roles bound to the operator in
    manifests/operator.yaml: a missing rule would be a 403 in a real cluster."""
    from test_operator_manifests import allowed, cluster_role_rules

    from gpt2bench.trainer.summary import steps_line

    log = steps_line([{"step": 1, "loss": 2.0, "grad_norm": 1.0}]) + "\n"
    benchmarks.create(benchmark("rbac", [{"name": "single"}]))
    play(trainer, "rbac", 1, lambda t, job, i: t.succeed(job, 1.0, log=log))
    wait_for(lambda: benchmarks.status("rbac").get("phase") == "Succeeded", what="Succeeded")
    wait_for(lambda: ("", "configmaps", "create") in operator_calls(cluster), what="the steps ConfigMap")

    made = operator_calls(cluster)
    rules = cluster_role_rules()
    assert {("kubeflow.org", "pytorchjobs", "create"), ("kubeflow.org", "pytorchjobs", "watch"), ("", "pods", "list"),
            ("", "pods/log", "get"), ("", "events", "create"), ("gpt2bench.io", "gpt2benchmarks/status", "patch"),
            ("gpt2bench.io", "gpt2benchmarks/finalizers", "update")} <= made
    assert [call for call in sorted(made) if not allowed(rules, *call)] == []


def test_a_sweep_that_repeats_until_decided_adds_whole_rounds_and_says_why_it_stopped(cluster, benchmarks, trainer):
    """ddp and fsdp measured alike never decide: the operator adds round 3, then stops at maxRepeats, saying so in
    status (roundsPlanned, roundsDone, stopReason) and with a RoundAdded Event; the same rule as the local runner's
    (report.sequential), read from the stored status alone."""
    sweep = {"strategies": [{"name": "ddp"}, {"name": "fsdp"}], "repeats": 2, "maxRepeats": 3, "breakdown": "off",
             "minEffect": 0, "scales": [{"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2}]}  # the strict race
    benchmarks.create(benchmark("until", sweep=sweep))
    assert wait_for(lambda: benchmarks.status("until").get("runsTotal"), what="runsTotal") == 4
    assert benchmarks.status("until")["roundsPlanned"] == 2
    from gpt2bench.plan import seed_for

    assert benchmarks.status("until")["orderSeed"] == seed_for("until", None)  # the rounds' order, recorded

    def alike(t: TrainingOperator, job: dict, i: int) -> None:
        t.succeed(job, 1000.0 + (i % 3))  # within a few parts in a thousand of each other: never decided

    order = play(trainer, "until", 6, alike)
    status = wait_for(lambda: (s := benchmarks.status("until")).get("phase") == "Succeeded" and s, what="Succeeded")
    assert [r["repeat"] for r in status["runs"]] == [1, 1, 2, 2, 3, 3] and len(order) == 6
    assert (status["runsTotal"], status["roundsPlanned"], status["roundsDone"]) == (6, 3, 3)
    assert status["stopReason"].startswith("max rounds: 3 rounds run, still racing at 1×2 CPU (")
    assert status["racing"] == 0 and "dropped" not in status  # alike: nothing dropped, and nothing runs on
    added = [e["message"] for e in benchmarks.posted("until", "RoundAdded")]
    assert len(added) == 1 and added[0].startswith("round 3 added for the 2 configurations still racing at 1×2 CPU")


def test_the_race_on_the_cluster_drops_the_beaten_and_creates_jobs_for_the_survivors_only(cluster, benchmarks, trainer):
    """ddp and fsdp alike, ps at half their speed: after round 3 the race drops ps (a ConfigurationDropped Event,
    status.dropped, the Racing column at 2), round 4 creates jobs for ddp and fsdp only, and the sweep stops at
    maxRepeats with ps run 3 times and the others 4 (beaten configurations cost no more GPU-hours)."""
    sweep = {"strategies": [{"name": "ddp"}, {"name": "fsdp"}, {"name": "ps"}], "repeats": 3, "maxRepeats": 4,
             "breakdown": "off", "minEffect": 0,  # the strict race: ddp and fsdp alike race on
             "scales": [{"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2}]}
    benchmarks.create(benchmark("race", sweep=sweep))
    assert wait_for(lambda: benchmarks.status("race").get("runsTotal"), what="runsTotal") == 9

    def speed(t: TrainingOperator, job: dict, i: int) -> None:
        t.succeed(job, (500.0 if "-ps-" in job["metadata"]["name"] else 1000.0) * (1 + (i % 3) / 1000))

    play(trainer, "race", 9, speed)
    racing = wait_for(lambda: (s := benchmarks.status("race")).get("roundsPlanned") == 4 and s, what="round 4")
    assert racing["racing"] == 2 and [d["configuration"] for d in racing["dropped"]] == ["race-ps-fp32-1x2"]
    table = cluster.kubectl("get", "gpt2benchmark", "race").stdout.split()
    assert table[table.index("race") + 4] == "2"  # RACING, after PHASE DONE RUNS
    play(trainer, "race", 2, speed)  # round 4: two jobs, not three
    status = wait_for(lambda: (s := benchmarks.status("race")).get("phase") == "Succeeded" and s, what="Succeeded")
    assert sorted(r["name"] for r in status["runs"] if r["repeat"] == 4) == ["race-ddp-fp32-1x2-r4",
                                                                             "race-fsdp-fp32-1x2-r4"]
    assert len(trainer.jobs("race")) == 11 and status["racing"] == 0
    dropped = [e["message"] for e in benchmarks.posted("race", "ConfigurationDropped")]
    assert len(dropped) == 1 and dropped[0].startswith("race-ps-fp32-1x2 dropped after round 3: race-")
    fastest = status["analysis"]["recommended"]
    assert fastest["dropped"][0]["configuration"] == "race-ps-fp32-1x2" and fastest["dropped"][0]["round"] == 3
