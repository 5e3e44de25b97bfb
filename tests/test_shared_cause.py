"""One cause, one stop (issues 47.1, 50.4): the pure rule both drivers call (`gpt2bench.diagnosis.holds`), on data.

The drivers' own tests: `tests/test_shared_cause_operator.py` (the real kopf operator against the emulator) and
`tests/test_shared_cause_local.py` (`gpt2bench run`'s sweep)."""

from __future__ import annotations

import pytest

from gpt2bench.diagnosis import holds, startup
from gpt2bench.status import FAILED, PENDING, RUNNING, SUCCEEDED, RunStatus

SOCKETS = ("pod b-ddp-2x8g-worker-0 (container pytorch) exited with code 1: NCCL reached the other nodes over sockets "
           "(NET/Socket) on 16 of 16 ranks, not over the cluster's fabric: stopped after the first step instead of "
           "measuring the wrong network (spec.fabric.require auto; `none` runs a socket baseline on purpose). "
           "docs/clusters.md says what each cluster's fabric needs")
MEMLOCK = ("spec.fabric.require rdma, but this process may lock only RLIMIT_MEMLOCK 8 MiB, CAP_IPC_LOCK not effective "
           "(RDMA registers the buffers it sends from; at least 16 GiB or unlimited is needed): raise the container "
           "runtime's memlock limit")
DRIVER = ("pod b-single-1x1g-master-0 (container pytorch) exited with code 1: --device cuda: no CUDA device is visible "
          "to this process (the pod got no nvidia.com/gpu, or the node's driver is older than the image's CUDA)")
PODSECURITY = ('pod b-ddp-2x8g-worker-0 not created: FailedCreatePod: Error creating: pods "b-ddp-2x8g-worker-0" is '
               'forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false (container '
               '"init-pytorch" must set securityContext.allowPrivilegeEscalation=false)')
TAINT = ("not started within runPolicy.startupSeconds (600 s): pod b-ddp-1x8g-master-0 Unschedulable: 0/3 nodes are "
         "available: 3 node(s) had untolerated taint {sku: gpu}. preemption: 0/3 nodes are available: 3 Preemption is "
         "not helpful for scheduling.")
RBAC = ('the API server refused PyTorchJob b-ddp-1x2: 403 Forbidden: pytorchjobs.kubeflow.org is forbidden: User '
        '"system:serviceaccount:gpt2bench:gpt2bench-operator" cannot create resource "pytorchjobs" in API group '
        '"kubeflow.org" in the namespace "team-a"')
DISK = ("pod b-ddp-1x2-master-0 (container pytorch) exited with code 1: OSError: [Errno 28] No space left on device: "
        "'/results/runs/b-ddp-1x2/steps.jsonl'")
QUOTA = ('the API server refused PyTorchJob x: 403 Forbidden: pytorchjobs.kubeflow.org "x" is forbidden: exceeded '
         'quota: compute, requested: requests.cpu=64, used: requests.cpu=0, limited: requests.cpu=8')


def entry(name: str, nodes: int = 1, gpus: int = 0, phase: str = PENDING, reason: str | None = None,
          kind: str = "PyTorchJob") -> RunStatus:
    return RunStatus(name=name, strategy="ddp", precision="fp32", nodes=nodes, devices_per_node=gpus,
                     processes_per_node=max(gpus, 1), job_kind=kind, job_name=name, phase=phase, reason=reason)


def sweep() -> list[RunStatus]:
    return [entry("one-cpu"), entry("one-gpu", gpus=8), entry("two-gpu", nodes=2, gpus=8),
            entry("four-gpu", nodes=4, gpus=8), entry("two-mpi", nodes=2, gpus=8, kind="MPIJob"),
            entry("two-cpu", nodes=2)]


@pytest.mark.parametrize(("reason", "kind", "held_runs"), [
    (SOCKETS, holds.FABRIC, {"two-gpu", "four-gpu", "two-mpi", "two-cpu"}),
    (MEMLOCK, holds.RDMA, {"one-cpu", "one-gpu", "two-gpu", "four-gpu", "two-mpi", "two-cpu"}),
    (DRIVER, holds.DRIVER, {"one-gpu", "two-gpu", "four-gpu", "two-mpi"}),
    (PODSECURITY, holds.ADMISSION, {"two-gpu", "four-gpu", "two-cpu"}),
    (TAINT, holds.TAINT, {"one-gpu", "two-gpu", "four-gpu", "two-mpi"}),
    (DISK, holds.DISK, {"one-cpu", "one-gpu", "two-gpu", "four-gpu", "two-mpi", "two-cpu"}),
])
def test_an_environment_failure_holds_exactly_the_pending_runs_that_share_it(reason, kind, held_runs):
    failed = entry("met", nodes=2, gpus=8, phase=FAILED, reason=reason)
    cause = holds.environment_cause(failed)
    assert cause is not None and cause.kind == kind
    before = [failed.model_copy(update={"phase": RUNNING, "reason": None}), *sweep()]
    after, new = holds.apply(before, [failed, *sweep()], "resume: do X")
    assert {e.name for e in after if holds.held(e)} == held_runs
    assert len(new) == 1 and new[0].startswith(f"held ({kind}): met failed for a cause ") and "(resume: do X)" in new[0]
    assert after[0] == failed  # the run that met it keeps its Failed record
    assert all(len(e.reason or "") < 512 for e in after)


@pytest.mark.parametrize("reason", [
    "loss is NaN at step 3",
    "pod x-master-0 (container pytorch) OOMKilled (exit code 137): torch.OutOfMemoryError: CUDA out of memory.",
    "not started within runPolicy.startupSeconds (600 s): pod x-master-0 ImagePullBackOff: Back-off pulling image",
    QUOTA,
])
def test_a_failure_of_the_runs_own_holds_nothing(reason):
    failed = entry("met", nodes=2, gpus=8, phase=FAILED, reason=reason)
    assert holds.environment_cause(failed) is None
    after, new = holds.apply([], [failed, *sweep()], "resume")
    assert new == [] and not any(holds.held(e) for e in after)


def test_a_run_failed_before_holds_nothing_again_and_a_released_run_stays_released():
    failed = entry("met", nodes=2, gpus=8, phase=FAILED, reason=SOCKETS)
    after, _ = holds.apply([], [failed, *sweep()], "resume")
    released = holds.release(after)
    assert not any(holds.held(e) for e in released)
    again, new = holds.apply(released, released, "resume")  # the same Failed run, seen by a later step
    assert new == [] and again == released


def test_only_a_403_of_authorization_is_a_shared_refusal():
    cause = holds.refusal_cause(RBAC)
    assert cause is not None and cause.kind == holds.FORBIDDEN and cause.scope == holds.Scope(job_kind="PyTorchJob")
    assert holds.refusal_cause(QUOTA) is None
    assert holds.refusal_cause(RBAC.replace("403 Forbidden", "422 Invalid")) is None
    policy = RBAC.replace("PyTorchJob", "NetworkPolicy", 1) + " (spec.networkPolicy.enabled: false runs without it)"
    assert holds.refusal_cause(policy).scope == holds.Scope()
    entries = holds.hold(sweep(), cause, "two-gpu", "tried again at every step")
    assert {e.name for e in entries if holds.held(e)} == {"one-cpu", "one-gpu", "two-gpu", "four-gpu", "two-cpu"}
    assert holds.retry_candidate(entries).name == "one-cpu"
    assert holds.summary(entries).startswith("5 runs held (forbidden): two-gpu was refused for a cause every "
                                             "PyTorchJob run shares (tried again at every step): the API server")


def test_release_by_cause_and_a_finished_run_is_never_held():
    entries = [entry("done", nodes=2, gpus=8, phase=SUCCEEDED), *sweep()]
    entries = holds.hold(entries, holds.refusal_cause(RBAC), "one-cpu", "r")
    entries = holds.hold(entries, holds.Cause(holds.FABRIC, holds.Scope(min_nodes=2), "w"), "x", "r")
    assert holds.held(entries[0]) is None and entries[0].reason is None
    # a run held already keeps its first cause; the MPIJob run (not covered by the PyTorchJob refusal) by fabric
    assert [holds.held(e) for e in entries[1:]] == [holds.FORBIDDEN] * 4 + [holds.FABRIC, holds.FORBIDDEN]
    released = holds.release(entries, [holds.FORBIDDEN])
    assert [holds.held(e) for e in released[1:]] == [None, None, None, None, holds.FABRIC, None]
    assert holds.release(entries, reason=entries[5].reason)[5].reason is None
    assert holds.summary(holds.release(released)) is None


def event(message: str, reason: str = "FailedCreatePod", type_: str = "Warning", at: str = "2026-11-29T01:00:00Z"):
    return {"type": type_, "reason": reason, "message": f'Error creating: pods "x-worker-0" is forbidden: {message}',
            "source": {"component": "pytorchjob-controller"}, "lastTimestamp": at}


@pytest.mark.parametrize(("answer", "kind"), [
    ('violates PodSecurity "restricted:latest": runAsNonRoot != true', startup.START),
    ("maximum cpu usage per Container is 4, but limit is 8", startup.START),  # a LimitRange
    ("exceeded quota: gpu, requested: requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=0, "
     "limited: requests.nvidia.com/gpu=4", startup.START),  # more than the whole quota: never
    ("exceeded quota: compute, requested: requests.cpu=500m,requests.memory=2Gi, used: requests.cpu=8,"
     "requests.memory=30Gi, limited: requests.cpu=8,requests.memory=32Gi", startup.CAPACITY),  # others use it up
])
def test_a_pod_the_api_server_refused_is_read_from_the_jobs_own_events(answer, kind):
    wait = startup.refused_creation([event("old", reason="Pulled", type_="Normal"), event(answer)])
    assert wait.kind == kind
    assert wait.words == f'pytorchjob-controller FailedCreatePod: Error creating: pods "x-worker-0" is forbidden: {answer}'
    assert startup.refused_creation([event(answer, reason="SuccessfulCreatePod", type_="Normal")]) is None


@pytest.mark.parametrize("flags", [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], ids=["sockets", "no-gpudirect", "both"])
def test_the_trainers_own_fabric_reason_is_recognised(flags):
    """The classifier reads the trainer's words (trainer/fabric.py `fallback_reason`), not a copy of them."""
    from gpt2bench.trainer.fabric import FabricPolicy, fallback_reason

    reason = fallback_reason(flags, 16, FabricPolicy("auto", True, None))
    failed = entry("met", nodes=2, gpus=8, phase=FAILED, reason=f"pod x-master-0 (container pytorch) exited with code "
                                                                f"1: {reason}")
    assert holds.environment_cause(failed).kind == holds.FABRIC


def test_the_trainers_own_memlock_reason_is_recognised():
    from gpt2bench.trainer.memlock import PinnedMemory

    problems = PinnedMemory(8 * 2**20, False, []).problems()
    failed = entry("met", phase=FAILED, reason="spec.fabric.require rdma, but " + "; and ".join(problems))
    assert holds.environment_cause(failed).kind == holds.RDMA  # the words trainer/cli.py prepare_fabric raises
