"""Render each planned run as the Kubeflow job it becomes. Pure functions: the operator creates what they
return, the local runner executes it, and `gpt2bench render FILE.yaml` prints it.

The job kind follows the run's resolved backend (gpt2bench.jobkinds, docs/backends.md):
- `pytorchjob`: PyTorchJob (kubeflow.org/v1) for every torch strategy; `mpijob`: MPIJob
  (kubeflow.org/v2beta1) for horovod;
- `trainjob`: a Trainer v2 TrainJob for every strategy, on the project's runtimes (`runtimes`);
- `pods`: what their pods share, built once per run (`run_pods`: labels, env, volumes, ports, resources,
  scheduling, run policy), which each kind's renderer (`RENDERERS`) turns into its job in one pass;
- `netpol`: the NetworkPolicy rendered with each run's job (`render_run`), which the operator creates before
  the job and `gpt2bench render` prints; the local runner executes the job alone (`render_job`), on its
  runtime when it names the benchmark's own (`run_runtimes`: a TrainJob with resource claims, trainjob.
  claims_runtime).
"""

from __future__ import annotations

from typing import Any

import yaml

from gpt2bench.plan import Run, plan_runs
from gpt2bench.render.mpijob import render_mpijob
from gpt2bench.render.netpol import render_network_policy
from gpt2bench.render.pods import RunPods, label_value, run_pods
from gpt2bench.render.pytorchjob import render_pytorchjob
from gpt2bench.render.trainjob import claims_runtime, render_trainjob
from gpt2bench.specification.model import Benchmark

# Each kind's renderer writes its job in one pass over the run's shared pod template (pods.run_pods).
RENDERERS = {"PyTorchJob": render_pytorchjob, "MPIJob": render_mpijob, "TrainJob": render_trainjob}

__all__ = ["dump_jobs", "label_value", "render_all", "render_job", "render_objects", "render_run", "run_runtimes"]


def render_job(benchmark: Benchmark, run: Run, backend: str | None = None) -> dict[str, Any]:
    """The run's job; `backend` (resolved: trainjob | pytorchjob) overrides the one it was planned with."""
    if backend is not None:
        run = run.for_backend(backend)
    return RENDERERS[run.job_kind](run_pods(benchmark, run))


def render_all(benchmark: Benchmark, backend: str | None = None) -> list[dict[str, Any]]:
    return [render_job(benchmark, run) for run in plan_runs(benchmark, backend)]


def run_runtimes(benchmark: Benchmark, run: Run, backend: str | None = None) -> list[dict[str, Any]]:
    """The Trainer v2 runtime the run's job needs created with it: the benchmark's own TrainingRuntime for a
    TrainJob with resource claims (trainjob.claims_runtime); none otherwise (the project's ClusterTrainingRuntimes
    are installed once, by the chart)."""
    if backend is not None:
        run = run.for_backend(backend)
    return _own_runtimes(run_pods(benchmark, run))


def _own_runtimes(pods: RunPods) -> list[dict[str, Any]]:
    runtime = claims_runtime(pods) if pods.run.job_kind == "TrainJob" else None
    return [runtime] if runtime else []


def render_run(benchmark: Benchmark, run: Run, backend: str | None = None) -> list[dict[str, Any]]:
    """Everything a run puts on a cluster, in creation order: its NetworkPolicy (unless the spec turns it
    off: spec.networkPolicy.enabled), its own runtime (run_runtimes: one a TrainJob with resource claims
    names), then its job; the run's pods are built once for both."""
    if backend is not None:
        run = run.for_backend(backend)
    pods = run_pods(benchmark, run)
    job = RENDERERS[run.job_kind](pods)
    policy = render_network_policy(benchmark, run, job["metadata"]["name"])
    return [*([policy] if policy else []), *_own_runtimes(pods), job]


def render_objects(benchmark: Benchmark, backend: str | None = None) -> list[dict[str, Any]]:
    """Every run's objects (render_run), run after run, a runtime shared by several runs once (before the first
    run that names it): what `gpt2bench render` prints."""
    objects, seen = [], set()
    for run in plan_runs(benchmark, backend):
        for obj in render_run(benchmark, run):
            key = (obj["kind"], obj["metadata"]["name"])
            if key not in seen:
                seen.add(key)
                objects.append(obj)
    return objects


class _NoAliasDumper(yaml.SafeDumper):
    """Print repeated structures in full: `&id001` anchors confuse readers and some GitOps tools."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_jobs(jobs: list[dict[str, Any]]) -> str:
    """Jobs as a multi-document YAML stream."""
    return yaml.dump_all(jobs, Dumper=_NoAliasDumper, sort_keys=False, explicit_start=True)
