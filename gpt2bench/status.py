"""The GPT2Benchmark status and the local results document: one definition of both.

The CRD's status schema is generated from these models (`gpt2bench.specification.crd`), and everything that writes or
reads a status goes through them: `collect` builds run entries, the operator's `reconcile` decides on
them, the local runner keeps them in `results.json`, and the report reads them back. A field that is not
declared here cannot be written (extra fields are errors), so status and schema cannot drift apart.

Shapes (camelCase on the wire, snake_case in Python):
- `RunResults`: the trainer summary's figures (docs/metrics.md);
- `RunStatus`: one run of the sweep (`status.runs[]`); `LocalRun` adds what only a local run has;
- `Condition`: `metav1.Condition`, in a list keyed by `type`;
- `Analysis`: the recommendation per objective and scale, scaling efficiencies and the papers' findings
  (computed by `gpt2bench.report.analysis`; definitions in docs/analysis.md), in both;
- `BenchmarkStatus`: the resource's `status`; `ResultsDocument`: `results.json`.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator
from pydantic.alias_generators import to_camel

from gpt2bench.clock import parse_rfc3339
from gpt2bench.files import held, write_atomic
from gpt2bench.objectives import OBJECTIVE_NAMES, OBJECTIVE_TABLE

# Run phases. Interrupted exists only locally (a cluster sweep is never Ctrl-C'd); Queued only on a cluster (the
# run's job exists but is suspended, e.g. by Kueue until its queue admits it). Skipped: the run did not train, on
# purpose (a half precision this hardware would only emulate, unless the spec opts in; locally also the runs an
# interrupted sweep never started); its reason says why.
PENDING, RUNNING, SUCCEEDED, FAILED = "Pending", "Running", "Succeeded", "Failed"
QUEUED = "Queued"
INTERRUPTED, SKIPPED = "Interrupted", "Skipped"
# Overall phases. PartiallySucceeded: every run finished, some failed, some succeeded (the comparison
# table still has rows to read, so it is not Failed; but not all strategies worked, so not Succeeded).
PARTIALLY_SUCCEEDED, INVALID = "PartiallySucceeded", "Invalid"
TERMINAL_RUN_PHASES = (SUCCEEDED, FAILED, SKIPPED)
FINISHED_PHASES = (SUCCEEDED, FAILED, PARTIALLY_SUCCEEDED, INVALID)

RunPhase = Literal["Pending", "Queued", "Running", "Succeeded", "Failed", "Skipped"]
LocalRunPhase = Literal["Pending", "Queued", "Running", "Succeeded", "Failed", "Interrupted", "Skipped"]
BenchmarkPhase = Literal["Pending", "Running", "Succeeded", "PartiallySucceeded", "Failed", "Invalid"]
LocalBenchmarkPhase = Literal["Pending", "Running", "Succeeded", "PartiallySucceeded", "Failed", "Invalid",
                              "Interrupted"]

DATE_TIME = {"format": "date-time"}

# The most runs a GPT2Benchmark's status is sized for: with every entry at its largest (tests/
# test_operator_status_size.py), status stays under STATUS_BYTES_BUDGET, leaving the rest of etcd's 1.5 MiB
# object limit to metadata. The spec's bound on runs per benchmark must not exceed it.
STATUS_RUNS_BUDGET = 512
STATUS_BYTES_BUDGET = 1024 * 1024


class StatusModel(BaseModel):
    """camelCase on the wire; unknown fields are errors, so nothing undeclared is ever written."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def dump(self) -> dict[str, Any]:
        """The JSON form the API server and results.json hold (unset and None fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    @classmethod
    def read(cls, data: Any) -> Self:
        """Parse a stored status or results.json: fields this version does not declare are dropped (as the
        API server prunes them from an object stored under an older schema); declared ones are checked."""
        return cls.model_validate(data, context={"read": True})

    @model_validator(mode="before")
    @classmethod
    def _drop_undeclared_when_reading(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and (info.context or {}).get("read"):
            declared = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
            return {key: value for key, value in data.items() if key in declared}
        return data


class RunResults(StatusModel):
    """A succeeded run's figures, from the trainer summary (definitions: docs/metrics.md)."""

    world_size: int | None = Field(None, description="Training workers (parameter servers excluded).")
    tokens_per_second: float | None = Field(None, description="Global tokens/s over the measured steps.")
    tokens_per_second_per_device: float | None = Field(None, description="tokensPerSecond / devices.")
    step_time_p50_seconds: float | None = Field(None, description="Median step time, measured steps.")
    step_time_p95_seconds: float | None = Field(None, description="95th percentile step time, measured steps.")
    peak_memory_bytes: int | None = Field(
        None, description="Largest step peak of any process in the memory the job trains in (GPU, else host).")
    train_seconds: float | None = Field(None, description="Worker 0: start of step 1 to end of the last step.")
    startup_seconds: float | None = Field(None, description="Worker 0: process start to the start of step 1.")
    final_loss: float | None = Field(None, description="Loss of the last step.")
    first_loss: float | None = Field(None, description="Loss of the first step.")
    grad_norm: float | None = Field(None, description="Gradient norm of the last step, before clipping.")
    mfu: float | None = Field(None, description="Model FLOPs utilisation, 0-1 (absent where the peak is unknown).")
    device_name: str | None = Field(None, description="What worker 0 trained on: the GPU's or the CPU's model name.")
    peak_flops_precision: str | None = Field(
        None, description="Which peak MFU is against: the precision of the run's matmuls (fp32, tf32, bf16, fp16).")
    compile_seconds: float | None = Field(None, description="Seconds torch.compile spent compiling (0: not compiled).")
    skipped_steps: int | None = Field(None, description="fp16 steps whose update the loss scaler skipped.")
    peak_device_memory_bytes: int | None = Field(
        None, description="Largest GPU memory peak (CUDA max allocated) of any process during the steps.")
    peak_host_memory_bytes: int | None = Field(
        None, description="Largest host memory peak (RSS high-water mark) of any process during the steps.")
    setup_peak_device_memory_bytes: int | None = Field(
        None, description="Largest GPU memory peak of any process during set-up (before step 1).")
    setup_peak_host_memory_bytes: int | None = Field(
        None, description="Largest host memory peak of any process during set-up (before step 1).")
    state_bytes: int | None = Field(
        None, description="Largest model state (parameters, gradients, optimizer state) resident in one process.")
    # The step breakdown (docs/metrics.md, Step breakdown): worker 0's means over the measured steps.
    data_seconds_mean: float | None = Field(None, description="Waiting for the next batch, per step.")
    forward_seconds_mean: float | None = Field(None, description="Forward pass and loss, per step.")
    backward_seconds_mean: float | None = Field(
        None, description="Backward pass, per step, less the communication it waited for (exposed).")
    optimizer_seconds_mean: float | None = Field(
        None, description="Clipping, optimizer step and zeroing, per step, less exposed communication.")
    other_seconds_mean: float | None = Field(None, description="The rest of the step (logging, bookkeeping).")
    comm_seconds_mean: float | None = Field(
        None, description="Communication per step, launch to completion of every collective / push / pull.")
    comm_exposed_seconds_mean: float | None = Field(
        None, description="Communication per step that computation did not hide: the step waited for it.")
    comm_hidden_ratio: float | None = Field(
        None, description="1 - exposed / total communication: the share overlap hid (Li 2020).")
    comm_bytes_per_step: int | None = Field(
        None, description="Bytes one rank sends per step, every collective kind together.")
    bus_kind: str | None = Field(
        None, description="The collective kind that moves the most bytes per step (allreduce, allgather, ...).")
    bus_bandwidth_achieved: float | None = Field(
        None, description="Bus bandwidth the steps achieved on bus_kind (nccl-tests' busbw), bytes/s.")
    bus_bandwidth_probed: float | None = Field(
        None, description="Bus bandwidth of bus_kind timed alone after training, at the steps' mean message "
                          "size on the same group (the collectives probe), bytes/s.")
    transport: str | None = Field(
        None, description="How NCCL connected the ranks (trainer/fabric.py): NET/IB, NET/OFI (EFA), NET/Socket or a "
                          "plugin's NET/<name> when a channel crossed nodes, else P2P/SHM inside one node.")
    nodes_used: int | None = Field(
        None, description="Distinct nodes the run's pods ran on (downward API); fewer than `nodes` means pods "
                          "shared a machine.")
    can_lock_memory: bool | None = Field(
        None, description="Every rank could lock the memory RDMA registers (RLIMIT_MEMLOCK unlimited or at least "
                          "16 GiB, or CAP_IPC_LOCK in effect): docs/clusters.md, Pinned memory.")
    memlock_bytes: int | None = Field(
        None, description="The lowest RLIMIT_MEMLOCK of any rank, bytes (absent: unlimited everywhere).")
    bus_bandwidth_share: float | None = Field(
        None, description="bus_bandwidth_achieved / bus_bandwidth_probed: what the strategy got of what the "
                          "network gives.")
    energy_joules_per_million_tokens: float | None = Field(
        None, description="Energy of the measured steps (NVML on GPUs, RAPL on CPUs) per 10^6 tokens.")
    energy_source: str | None = Field(None, description="Where the energy figure comes from (nvml, rapl).")
    energy_unavailable_reason: str | None = Field(None, description="Why the run has no energy figure.")
    threads_per_rank: int | None = Field(
        None, description="Intra-op CPU threads of each process (torch.get_num_threads() read inside every rank; "
                          "the largest if they differ).")
    cores_per_rank: float | None = Field(
        None, description="CPU cores each process may use: its pod's CPU budget / the processes in the pod.")
    compile_threads: int | None = Field(
        None, description="torch.compile's (inductor's) compile worker processes per rank: its share of the pod's "
                          "cores, unless the pod's env sets TORCHINDUCTOR_COMPILE_THREADS.")
    step_time_halves_ratio: float | None = Field(
        None, description="Step time of the second half of the measured steps / the first half's (geometric means): "
                          "below 1 the run was still getting faster.")
    step_time_halves_low: float | None = Field(None, description="Lower end of its 95 % interval (Welch).")
    step_time_halves_high: float | None = Field(None, description="Upper end of its 95 % interval (Welch).")


class RunStatus(StatusModel):
    """One run of the sweep, as `status.runs[]` holds it (docs/design.md, Results entry)."""

    name: str = Field(description="Run name (also the job's name).")
    strategy: str = Field(description="The run's data-parallel strategy (spec.sweep.strategies[].name).")
    precision: str = Field(description="The run's precision: fp32, fp16 or bf16.")
    nodes: int = Field(description="Pods of the run's job (its scale's nodes).")
    devices_per_node: int = Field(description="GPUs per pod; 0: CPU.")
    processes_per_node: int = Field(description="Processes per pod, parameter servers included.")
    job_kind: str = Field(description="PyTorchJob or MPIJob.")
    job_name: str = Field(description="The run's job (PyTorchJob, MPIJob or TrainJob) in the benchmark's namespace.")
    devices: int | None = Field(None, description="Devices it trains on: GPUs, or worker processes on CPU.")
    repeat: int | None = Field(None, ge=1, description="The round it ran in: every configuration runs once per round "
                                                       "(sweep.repeats > 1).")
    profile: bool | None = Field(None, description="A breakdown-round run: timed with the step breakdown's hooks, "
                                                   "used in no decision (sweep.breakdown: separate).")
    phase: RunPhase = Field(description="Pending, Queued (job suspended, e.g. by Kueue), Running, Succeeded, Failed or "
                                        "Skipped (not trained on purpose: `reason` says why).")
    start_time: str | None = Field(None, description="When the run's job was created.", json_schema_extra=DATE_TIME)
    completion_time: str | None = Field(None, description="When the run finished, succeeded or not.",
                                        json_schema_extra=DATE_TIME)
    reason: str | None = Field(None, description="Why the run failed or was skipped; on a Pending run, why it waits: "
                                                  "`held (<cause>): ...` (a cause it shares with a run that failed: "
                                                  "docs/operator.md, One cause, one stop) or `preempted, to run again "
                                                  "once: ...`; on a run run again after a preemption, that too.")
    waiting: str | None = Field(
        None, description="While its job is queued or its pods start: what it waits for (the pod, and the "
                          "scheduler's or the kubelet's reason and message).")
    waiting_kind: Literal["capacity", "start"] | None = Field(
        None, description="What `waiting` is: capacity that may still come (a scale-up, busy nodes, a gang, an image "
                          "pulling: runPolicy.capacitySeconds), or a start that will not come by waiting (an image "
                          "that cannot be pulled, a bad config, no node that fits: runPolicy.startupSeconds).")
    waiting_since: str | None = Field(
        None, description="Since when its pods wait for what `waitingKind` says (a pod re-created after the run "
                          "started: since that pod's creation).", json_schema_extra=DATE_TIME)
    pods_started_time: str | None = Field(
        None, description="When every pod of its job had started (runPolicy.startupSeconds no longer applies, "
                          "except to a pod re-created later).",
        json_schema_extra=DATE_TIME)
    results: RunResults | None = Field(None, description="The trainer's summary figures (docs/metrics.md).")

    def wall_seconds(self) -> float | None:
        """Seconds from its start to its completion (its wall time, as recorded); None until both are known."""
        if not (self.start_time and self.completion_time):
            return None
        return (parse_rfc3339(self.completion_time) - parse_rfc3339(self.start_time)).total_seconds()


def fabric_warnings(run: RunStatus) -> list[str]:
    """What a succeeded run's figures do not measure (trainer/fabric.py, docs/clusters.md): a multi-node run whose
    pods shared fewer nodes, and one whose NCCL traffic between nodes went over sockets, not the fabric. The
    report lists them beside the bus bandwidth; the operator posts each as a Warning Event."""
    figures = run.results
    if run.phase != SUCCEEDED or figures is None:
        return []
    warnings = []
    if figures.nodes_used is not None and figures.nodes_used < run.nodes:
        warnings.append(f"{run.name}: a {run.nodes}-node run that ran on {figures.nodes_used} node(s): its pods "
                        f"shared a machine, so it is no {run.nodes}-node figure")
    if run.nodes > 1 and figures.transport and "NET/Socket" in figures.transport:
        warnings.append(f"{run.name}: NCCL's traffic between nodes went over sockets (NET/Socket), not the "
                        "cluster's fabric (docs/clusters.md)")
    if run.nodes > 1 and run.devices_per_node and figures.transport == "gloo/TCP":
        warnings.append(f"{run.name}: the parameter servers' messages between nodes went over gloo (TCP), not the "
                        "cluster's fabric (docs/clusters.md)")
    return warnings


class LocalRun(RunStatus):
    """A run of `gpt2bench run`: local-only phases, and where its files are (relative to the folder)."""

    phase: LocalRunPhase = Field(description="Pending, Running, Succeeded, Failed, Interrupted or Skipped.")
    run_dir: str | None = None
    steps_file: str | None = None
    job_seconds: float | None = Field(None, description="Its job here: the first process started to the last one's "
                                                        "exit seen (monotonic clock).")
    overhead_seconds: float | None = Field(
        None, description="Start-up per run: jobSeconds minus results.trainSeconds (worker 0's first step to the "
                          "end of its last), i.e. launchers, interpreters, imports, rendezvous, data, model, and "
                          "everything after the last step until the job has ended (docs/local.md).")


class BestRun(StatusModel):
    """The configuration with the highest geometric mean tokens/s over its succeeded runs, at any scale, whatever
    the noise (the same figure as the report's tables and recommendations)."""

    run: str = Field(description="The configuration: its runs' name without -r<k>.")
    strategy: str = Field(description="Its strategy.")
    precision: str = Field(description="Its precision.")
    tokens_per_second: float = Field(description="The geometric mean of its runs' global tokens/s.")


# Condition types of a GPT2Benchmark, as batch Jobs have them: Ready (results are there: Succeeded or
# PartiallySucceeded), Complete (every run finished and at least one has results), Failed (no run succeeded, or
# the spec is invalid), Finished (the sweep ended, whichever way: Complete or Failed, reason the phase; what
# `kubectl wait --for=condition=Finished` waits for, since waiting for Complete hangs when the sweep fails),
# Queued (a run's job is suspended, waiting for its queue), and SpecChangeIgnored. Each carries the generation
# it was decided on.
READY, COMPLETE, FAILED_CONDITION, QUEUED_CONDITION = "Ready", "Complete", "Failed", "Queued"
FINISHED_CONDITION = "Finished"
SPEC_CHANGE_IGNORED = "SpecChangeIgnored"
SPEC_UNREADABLE = "SpecUnreadable"  # the operator running cannot read the spec a sweep was pinned with

# The objectives a report recommends for, in the order every report shows them, with the words its verdicts use
# (the table: gpt2bench.objectives).
OBJECTIVES = {objective.name: objective.wording for objective in OBJECTIVE_TABLE}
Objective = Literal[OBJECTIVE_NAMES]  # type: ignore[valid-type]  # the table's names, for the schema
_LISTED_OBJECTIVES = f"{', '.join(OBJECTIVE_NAMES[:-1])} or {OBJECTIVE_NAMES[-1]}"
_FAMILIES = ", ".join([*(o.name for o in OBJECTIVE_TABLE if o.ranking != "race"), "findings"])
Decision = Literal["clear", "equivalent", "no-clear-winner", "needs-repeats", "only-candidate", "not-measurable",
                   "unstable"]
Verdict = Literal["holds", "does-not-hold", "inconclusive", "needs-repeats", "not-measurable"]


ConfigurationName = Annotated[str, Field(description="A configuration: its runs' name without -r<k>.")]
RunName = Annotated[str, Field(description="A run's name.")]


class DroppedConfiguration(StatusModel):
    """A configuration out of the selection race: a surviving one beat it, so it ran no more rounds."""

    configuration: ConfigurationName
    round: int = Field(ge=1, description="The round after which it was dropped (it ran no later round).")
    behind: ConfigurationName = Field(description="The configuration that beat it most clearly.")
    ratio: float = Field(description="That configuration's tokens/s over this one's, within rounds (1.12: 12 % "
                                     "faster).")
    low: float = Field(description="The least that ratio can be at the race's level (above 1: beaten).")


class UnstableConfiguration(StatusModel):
    """A configuration whose runs fell into two speeds: set aside by its race, unranked (docs/analysis.md)."""

    configuration: ConfigurationName
    fast_runs: int = Field(ge=0, description="Its runs at the fast speed.")
    fast: float = Field(description="Their geometric mean, in the recommendation's unit.")
    slow_runs: int = Field(ge=0, description="Its runs at the slow speed.")
    slow: float = Field(description="Their geometric mean, in the recommendation's unit.")


class Recommendation(StatusModel):
    """The best configuration for one objective at one scale, and how sure that is (docs/analysis.md)."""

    objective: Objective = Field(description=f"{_LISTED_OBJECTIVES}.")
    scale: str | None = Field(None, description="Nodes x devices per node (e.g. 2x4 GPU); absent: all scales.")
    decision: Decision = Field(description="clear (a winner), equivalent (fastest or within sweep.minEffect of it), "
                                           "no-clear-winner (the best is among `candidates`), needs-repeats (too few "
                                           "rounds to decide), only-candidate, not-measurable, unstable (the "
                                           "configurations left to rank fell into two speeds: nothing ranked).")
    verdict: str | None = Field(None, description="The decision in one line, e.g. `horovod bf16 is the fastest "
                                                  "(error rate ≤ 5 %)`.")
    winner: str | None = Field(None, description="The recommended configuration; set only when the decision is clear "
                                                 "or only-candidate.")
    run: str | None = Field(None, description="The top-ranked configuration (its run name without -r<k>): the winner, "
                                              "the equivalent pick, or the best estimate.")
    strategy: str | None = Field(None, description="The top-ranked configuration's strategy.")
    precision: str | None = Field(None, description="The top-ranked configuration's precision.")
    value: float | None = Field(None, description="The top-ranked configuration's geometric mean over its rounds, in "
                                                  "`unit` (the figure every table and metric shows).")
    unit: str | None = Field(None, description="Unit of value and runnerUpValue, e.g. tokens/s or bytes.")
    spread: float | None = Field(None, description="Its noise: the sample standard deviation of ln(figure) over its "
                                                   "rounds (0.05: about 5 %).")
    measurements: int | None = Field(None, description="Succeeded repeats behind `value`.")
    runner_up: str | None = Field(None, description="The second-ranked configuration.")
    runner_up_value: float | None = Field(None, description="The runner-up's geometric mean, in `unit`.")
    margin: float | None = Field(None, description="How much better the top-ranked is than the runner-up, relative to "
                                                   "the runner-up (within rounds; positive: better).")
    margin_low: float | None = Field(None, description="Lower end of the margin's interval at `confidence`.")
    margin_high: float | None = Field(None, description="Upper end of the margin's interval at `confidence`.")
    interval_coverage: float | None = Field(
        None, description="fastest: the margin interval's coverage, at the race's bar (1 − 2 × its comparisons' "
                          "level), valid at whichever round the race stopped.")
    confidence: float | None = Field(None, description="The chance that this decision is right: 0.95 for every "
                                                        "race and every family of decisions (docs/analysis.md).")
    paired: bool | None = Field(None, description="The margin compares within rounds (each round's shared drift "
                                                  "cancels); false: unpaired (fewer than 3 rounds in common).")
    noise_df: float | None = Field(None, description="Degrees of freedom of the margin's interval (0: too few rounds).")
    candidates: list[ConfigurationName] | None = Field(
        None, description="no-clear-winner: the configurations still in the race, one of which is the fastest; "
                          "equivalent: the pick and its surviving rivals; needs-repeats: every configuration, best "
                          "first.")
    dropped: list[DroppedConfiguration] | None = Field(
        None, description="fastest: the configurations the race dropped, in the order it dropped them.")
    decided_in: int | None = Field(None, ge=1, description="The round after which the race decided.")
    unstable: list[UnstableConfiguration] | None = Field(
        None, description="fastest: configurations set aside unranked, their runs in two speeds.")
    behind_at_most: float | None = Field(
        None, description="equivalent: how far behind the fastest the pick can be at most (0.03: 3 %).")
    excluded: list[RunName] | None = Field(
        None, description="Runs at this scale left out: they did not succeed.")
    rounds_needed: int | None = Field(
        None, description="no-clear-winner: a sweep.maxRepeats at which the race would decide with 80 % probability, "
                          "simulated from what it measured (absent: decided, or not within 50 rounds).")
    round_seconds: float | None = Field(None, description="Wall time one more round of the undecided configurations "
                                                          "would take (seconds; their runs' mean durations summed).")
    round_cost: float | None = Field(None, description="Price of one more round of their runs (spec.cost's currency).")
    per_rank: str | None = Field(None, description="CPU: the threads and cores per rank of the configurations "
                                                   "ranked here (CPU runs rank only with equal resources per rank).")
    ranked_apart: list[ConfigurationName] | None = Field(
        None, description="Configurations of this scale ranked in their own group: their ranks had other CPU "
                          "resources (each with its threads and cores per rank).")
    note: str | None = Field(None, description="A remark on the decision, e.g. why it is not measurable.")


class ScalingEfficiency(StatusModel):
    """Tokens/s per device at one scale over the same strategy and precision at its smallest scale."""

    strategy: str = Field(description="The strategy.")
    precision: str = Field(description="The precision.")
    scale: str = Field(description="The scale measured, e.g. 2x4 GPU.")
    devices: int = Field(description="Devices at that scale.")
    baseline_scale: str = Field(description="The smallest scale of the same strategy and precision.")
    baseline_devices: int = Field(description="Devices at the baseline scale.")
    tokens_per_second_per_device: float = Field(description="Mean tokens/s per device at this scale.")
    efficiency: float = Field(description="Tokens/s per device here over the baseline's (1: perfect scaling).")
    spread: float | None = Field(None, description="Propagated from both scales' spreads (docs/analysis.md).")
    low: float | None = Field(None, description="Lower end of the efficiency's confidence interval.")
    high: float | None = Field(None, description="Upper end of the efficiency's confidence interval.")
    refused: str | None = Field(None, description="Why it measures no scaling (CPU ranks with fewer cores each than "
                                                  "the baseline's): no scaling verdict rests on it.")


class Finding(StatusModel):
    """One of the papers' claims, checked on this sweep's measurements."""

    id: str = Field(description="The finding's identifier (docs/analysis.md, Findings).")
    claim: str = Field(description="The claim, as the paper makes it.")
    source: str = Field(description="The paper and where in it.")
    verdict: Verdict = Field(description="holds, does-not-hold, inconclusive (the interval crosses the claim's "
                                         "threshold), needs-repeats (single measurements: not decided) or "
                                         "not-measurable.")
    measured: str = Field(description="The figures the verdict rests on, each with its interval, or what the sweep "
                                      "lacks.")
    deciding: str | None = Field(None, description="The comparison that decides the verdict (for holds: the one "
                                                   "nearest its threshold).")
    estimate: float | None = Field(None, description="Its ratio (or loss gap), see `threshold`.")
    low: float | None = Field(None, description="Lower end of its confidence interval.")
    high: float | None = Field(None, description="Upper end of its confidence interval.")
    threshold: float | None = Field(None, description="What the claim compares the ratio with (1: no difference).")
    confidence: float | None = Field(None, description="Confidence level of each comparison's interval "
                                                       "(Bonferroni over the claim's comparisons).")


class FigureNoise(StatusModel):
    """The sweep's own noise for one figure at one scale: its pooled coefficient of variation over the repeats,
    and the configurations far noisier than the rest, which keep their own."""

    figure: str = Field(description="tokensPerSecond, peakMemoryBytes, costPer1MTokens, ...")
    scale: str | None = Field(None, description="The scale whose configurations are pooled.")
    cv: float = Field(description="Pooled coefficient of variation (standard deviation of ln x) of one run.")
    df: float = Field(description="Degrees of freedom: repeats beyond the first, summed over the pooled "
                                  "configurations.")
    configurations: int = Field(description="Configurations pooled (measured at least twice).")
    noisier: list[Annotated[str, Field(description="A configuration and its own noise: `name ±cv (df)`.")]] | None = (
        Field(None, description="Far noisier configurations with their own noise."))
    paired_cv: float | None = Field(None, description="The same noise once each round's shared effect is out (the "
                                                      "configurations that ran in every round): what paired "
                                                      "comparisons use.")
    paired_df: float | None = Field(None, description="Degrees of freedom of paired_cv.")
    round_share: float | None = Field(None, description="Share of the configurations' spread that the rounds' shared "
                                                        "effects explain (1 - residual / within).")
    round_effects: list[Annotated[float, Field(description="One round's shared effect, relative (+0.05: every run "
                                                           "5 % higher).")]] | None = Field(
        None, description="Each round's shared effect, in round order.")


class Analysis(StatusModel):
    """What the report concludes from the runs: computed when every run is done (docs/analysis.md)."""

    recommended: Recommendation | None = Field(None, description="Fastest at the largest scale measured.")
    alpha: float | None = Field(None, description="The chance that an answer is wrong: of each race's (one per scale "
                                                  "and resource group), and of each family of other decisions "
                                                  f"({_FAMILIES}), 0.05.")
    racing: list[ConfigurationName] | None = Field(
        None, description="The configurations still in a race: the next round, if any, runs these only.")
    noise: list[FigureNoise] = Field(default_factory=list, description="The sweep's noise per figure.")
    recommendations: list[Recommendation] = Field(default_factory=list,
                                                  description="The recommendation per objective and scale.")
    scaling: list[ScalingEfficiency] = Field(default_factory=list,
                                             description="Scaling efficiency of every configuration above its "
                                                         "smallest scale.")
    findings: list[Finding] = Field(default_factory=list, description="The papers' claims and their verdicts.")
    checks: list[Finding] = Field(default_factory=list, description="Checks that the strategies compute the same "
                                                                     "thing (the loss curves agree).")


class Condition(StatusModel):
    """`metav1.Condition`: the shape `kubectl wait --for=condition=...` and every tool expect."""

    type: str = Field(max_length=316, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                                                r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
                      description="Ready, Complete, Failed, Finished, Queued or SpecChangeIgnored.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                        description="Why, in one CamelCase word.")
    message: str = Field(max_length=32768, description="Why, in words.")
    last_transition_time: str = Field(description="When status last changed.", json_schema_extra=DATE_TIME)
    observed_generation: int | None = Field(None, ge=0, description="The generation the condition was decided on.")


# A list of conditions is a map keyed by type, as in every Kubernetes API.
CONDITIONS_LIST = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}


class BenchmarkStatus(StatusModel):
    """`status` of a GPT2Benchmark, written by the operator (docs/operator.md, Status)."""

    phase: BenchmarkPhase | None = Field(
        None, description="Running, Succeeded, PartiallySucceeded, Failed or Invalid.")
    message: str | None = Field(None, description="What the sweep is doing, or why it stopped.")
    observed_generation: int | None = Field(None, description="The generation whose spec the sweep runs.")
    runs_total: int | None = Field(None, description="Runs the sweep plans.")
    runs_done: int | None = Field(None, description="Runs finished: succeeded, failed or skipped.")
    runs_succeeded: int | None = Field(None, description="Runs that succeeded.")
    runs_failed: int | None = Field(None, description="Runs that failed (status.runs[].reason says why).")
    runs_skipped: int | None = Field(None, description="Runs not trained on purpose (their reason says why).")
    start_time: str | None = Field(None, description="When the sweep started.", json_schema_extra=DATE_TIME)
    completion_time: str | None = Field(None, description="When the last run finished.", json_schema_extra=DATE_TIME)
    backend: str | None = Field(
        None, description="The backend the sweep runs on, trainjob or pytorchjob: spec.backend, or what `auto` "
                          "resolved to from the job kinds the API server serves (TrainJob preferred).")
    order_seed: int | None = Field(None, description="Seed of the rounds' shuffled order (sweep.orderSeed, else derived "
                                                     "from the benchmark's name): round r shuffles with seed + r.")
    rounds_planned: int | None = Field(None, description="Decision rounds planned so far (sweep.repeats, plus the "
                                                         "rounds added until decided).")
    rounds_done: int | None = Field(None, description="Decision rounds whose every run has finished.")
    stop_reason: str | None = Field(None, description="Why the sweep added no more rounds: decided, budget spent, "
                                                      "max rounds.")
    racing: int | None = Field(None, description="Configurations still in a selection race: the next round, if one is "
                                                 "added, runs these only (0 once the sweep stops adding rounds).")
    dropped: list[DroppedConfiguration] | None = Field(
        None, description="Configurations the selection race dropped so far: after which round, and behind which.")
    waiting: str | None = Field(
        None, description="What its running runs wait for while their jobs are queued or their pods start, after "
                          "the runs held by a cause they share (empty when nothing waits): shown by `kubectl get`.")
    best: BestRun | None = Field(None, description="The succeeded run with the highest tokens/s.")
    analysis: Analysis | None = Field(None, description="Recommendations, scaling efficiencies, papers' findings.")
    runs: list[RunStatus] | None = Field(None, description="One entry per run, in plan order.")
    conditions: list[Condition] | None = Field(
        None, description="Ready, Complete, Failed, Finished, Queued, RunsHeld (runs held by a cause they share). "
                          "`kubectl wait --for=condition=Finished` ends when the sweep does, whichever way (its reason "
                          "is the phase); Complete: with results.",
        json_schema_extra=CONDITIONS_LIST)


RESULTS_JSON = "results.json"


class ResultsDocument(StatusModel):
    """`results.json` of a local sweep, or a cluster benchmark's status read back by `gpt2bench report`."""

    benchmark: str | None = None
    namespace: str | None = None
    spec: dict[str, Any] = Field(default_factory=dict)
    runs: list[LocalRun] = Field(default_factory=list)
    phase: LocalBenchmarkPhase | Literal["Unknown"] = "Unknown"
    best: BestRun | None = None
    analysis: Analysis | None = None
    start_time: str | None = None
    completion_time: str | None = None
    order_seed: int | None = Field(None, description="Seed of the rounds' shuffled order (sweep.orderSeed, else derived "
                                                     "from the benchmark's name): round r shuffles with seed + r.")
    rounds_planned: int | None = Field(None, description="Decision rounds planned so far (sweep.repeats, plus the "
                                                         "rounds added until decided).")
    rounds_done: int | None = Field(None, description="Decision rounds whose every run has finished.")
    stop_reason: str | None = Field(None, description="Why the sweep added no more rounds: decided, budget spent, "
                                                      "max rounds.")
    racing: int | None = Field(None, description="Configurations still in a selection race: the next round, if one is "
                                                 "added, runs these only (0 once the sweep stops adding rounds).")
    dropped: list[DroppedConfiguration] | None = Field(
        None, description="Configurations the selection race dropped so far: after which round, and behind which.")

    def save(self, directory: str | os.PathLike) -> Path:
        """Write DIR/results.json whole or not at all (an interrupted sweep leaves a readable file)."""
        path = Path(directory) / RESULTS_JSON
        write_atomic(path, json.dumps(self.dump(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | os.PathLike) -> ResultsDocument:
        """Read DIR/results.json. Raises OSError, ValueError (not JSON) or pydantic's ValidationError."""
        return cls.read(json.loads((Path(directory) / RESULTS_JSON).read_text(encoding="utf-8")))

    @classmethod
    def from_resource(cls, resource: dict[str, Any]) -> ResultsDocument:
        """A GPT2Benchmark object as the API returns it."""
        metadata = resource.get("metadata") or {}
        status = BenchmarkStatus.read(resource.get("status") or {})
        return cls(benchmark=metadata.get("name"), namespace=metadata.get("namespace"),
                   spec=resource.get("spec") or {}, runs=[LocalRun.read(r.dump()) for r in status.runs or []],
                   phase=status.phase or "Unknown", best=status.best, analysis=status.analysis,
                   start_time=status.start_time,
                   completion_time=status.completion_time, order_seed=status.order_seed,
                   rounds_planned=status.rounds_planned,
                   rounds_done=status.rounds_done, stop_reason=status.stop_reason, racing=status.racing,
                   dropped=status.dropped)


# ------------------------------------------------------------------ an interrupted local sweep
NOT_STARTED = "not started: the sweep was interrupted"
ABANDONED = ("the gpt2bench run writing this folder stopped while this run was in flight, without a word "
             "(killed, or the machine went down); `gpt2bench run --resume` runs it again")


def interrupt_runs(runs: list[LocalRun], in_flight: str, not_started: str = NOT_STARTED) -> list[LocalRun]:
    """A stopped sweep's entries: the run in flight Interrupted (`in_flight` says why), the runs not started Skipped,
    the finished ones as they were."""
    reasons = {RUNNING: (INTERRUPTED, in_flight), PENDING: (SKIPPED, not_started)}
    return [run.model_copy(update=dict(zip(("phase", "reason"), reasons[run.phase]))) if run.phase in reasons
            else run for run in runs]


def settle_abandoned(doc: ResultsDocument, directory: str | os.PathLike) -> ResultsDocument:
    """DIR's results document as it must be read: a sweep still Running that no live `gpt2bench run` holds
    (files.holding) was stopped without a chance to say so, so it is Interrupted, and so is its run in flight."""
    if doc.phase != RUNNING or held(directory):
        return doc
    return doc.model_copy(update={"runs": interrupt_runs(doc.runs, ABANDONED), "phase": INTERRUPTED})


def interrupted_note(doc: ResultsDocument, directory: str | os.PathLike) -> str | None:
    """What `gpt2bench report` and `gpt2bench run` say of a folder whose sweep was interrupted (Ctrl-C, a closed
    terminal, its runner killed: `settle_abandoned`): how far it got and how to finish it; None otherwise."""
    if doc.phase != INTERRUPTED:
        return None
    finished = sum(run.phase in (SUCCEEDED, FAILED) for run in doc.runs)
    return (f"the sweep in {directory} was interrupted with {finished} of {len(doc.runs)} runs finished: "
            f"`gpt2bench run FILE --resume --output {directory}` (FILE: GPT2Benchmark {doc.benchmark}'s file) keeps "
            f"them and runs the rest")


# ------------------------------------------------------------------ rules over runs
def best_run(runs: list[RunStatus]) -> BestRun | None:
    """The configuration with the highest geometric mean tokens/s over its succeeded decision runs (every run
    where the sweep has no rounds), at any scale (ties: the earlier in plan order)."""
    found: dict[tuple, tuple[str, RunStatus, list[float]]] = {}
    for run in runs:
        tps = run.results.tokens_per_second if run.results else None
        if run.phase != SUCCEEDED or tps is None or tps <= 0 or run.profile:
            continue
        key = (run.strategy, run.precision, run.nodes, run.devices_per_node, run.processes_per_node)
        suffix = f"-r{run.repeat}" if run.repeat else ""
        name = run.name[: -len(suffix)] if suffix and run.name.endswith(suffix) else run.name
        found.setdefault(key, (name, run, []))[2].append(tps)
    best = None
    for name, run, values in found.values():  # values all alike: that value (exp(ln x) may differ from x in a bit)
        value = values[0] if len(set(values)) == 1 else math.exp(sum(map(math.log, values)) / len(values))
        if best is None or value > best.tokens_per_second:
            best = BestRun(run=name, strategy=run.strategy, precision=run.precision, tokens_per_second=value)
    return best


def overall_phase(runs: list[RunStatus]) -> str:
    """Running until every run is done; then Succeeded (none failed), Failed (none succeeded) or
    PartiallySucceeded. Skipped runs failed nothing: a sweep whose other runs all succeeded has Succeeded."""
    if not runs:
        return SUCCEEDED
    if any(r.phase not in TERMINAL_RUN_PHASES for r in runs):
        return RUNNING
    succeeded = sum(r.phase == SUCCEEDED for r in runs)
    failed = sum(r.phase == FAILED for r in runs)
    if succeeded == 0:
        return FAILED
    return PARTIALLY_SUCCEEDED if failed else SUCCEEDED


def status_label(entry: RunStatus) -> str:
    """`Succeeded`, or the phase with its reason on one line (at most 160 characters), for tables."""
    reason = " ".join((entry.reason or "").split())
    if entry.phase == SUCCEEDED or not reason:
        return entry.phase
    if len(reason) > 160:
        reason = reason[:157] + "..."
    return f"{entry.phase}: {reason}"
