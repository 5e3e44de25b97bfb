"""The status a sweep's runs make, as the operator writes it: the phase and its message, the counts and the best
run (`gpt2bench.sweepcore.tally`), the conditions `kubectl wait` and `kubectl get` read (Ready, Complete, Failed,
Finished, Queued, RunsHeld, SpecChangeIgnored, SpecUnreadable), the Waiting column, and the analysis once the
sweep has finished. Pure: the entries, the stored status and `now` in, a status out.
"""

from __future__ import annotations

from typing import Any

from gpt2bench import collect, sweepcore
from gpt2bench.diagnosis import holds
from gpt2bench.plan import Run, configuration_of, seed_for
from gpt2bench.specification.model import GPT2BenchmarkSpec
from gpt2bench.status import (
    COMPLETE,
    FAILED,
    FAILED_CONDITION,
    FINISHED_CONDITION,
    FINISHED_PHASES,
    INVALID,
    PARTIALLY_SUCCEEDED,
    PENDING,
    QUEUED,
    QUEUED_CONDITION,
    READY,
    RUNNING,
    SPEC_CHANGE_IGNORED,
    SPEC_UNREADABLE,
    SUCCEEDED,
    BenchmarkStatus,
    Condition,
    RunStatus,
)
from gpt2bench.sweepcore import spec_document

from .decide import STATUS_REASON_LIMIT


def initial_status(runs: list[Run], generation: int | None, now: str) -> BenchmarkStatus:
    """The status a new sweep starts with: every run Pending, nothing started (and, in rounds, the rounds
    planned: a sweep that repeats until decided adds more)."""
    rounds = max((run.repeat or 0 for run in runs), default=0) or None
    status = BenchmarkStatus(
        rounds_planned=rounds,
        order_seed=seed_for(runs[0].benchmark, runs[0].spec.sweep.order_seed) if rounds and runs[0].spec else None,
        phase=RUNNING,
        message=f"{len(runs)} runs planned",
        observed_generation=generation,
        runs_total=len(runs),
        runs_done=0,
        runs_succeeded=0,
        runs_failed=0,
        start_time=now,
        backend=runs[0].backend if runs else None,
        runs=[collect.run_entry(run, phase=PENDING) for run in runs],
        conditions=[],
    )
    status.conditions = sweep_conditions([], RUNNING, status.message, status.runs, generation, now)
    return status


def invalid_status(errors: list[tuple[str, str]], generation: int | None, now: str) -> BenchmarkStatus:
    message = collect.clean_reason("invalid spec: " + "; ".join(f"{path}: {msg}" for path, msg in errors))
    return BenchmarkStatus(
        phase=INVALID,
        message=message,
        observed_generation=generation,
        runs_total=0,
        runs_done=0,
        runs=[],
        conditions=sweep_conditions([], INVALID, message, [], generation, now),
    )


def sweep_started(status: dict[str, Any]) -> bool:
    """A sweep has started once its status lists its runs (Running, then finished): its spec is pinned and
    later edits are ignored. Before that (no phase yet, Pending, Invalid, or an earlier version's Failed
    without runs) nothing ran, and the operator starts it from the current spec."""
    return bool(status.get("runs"))


def pending_status(reason: str, generation: int | None, now: str, retry_seconds: float) -> BenchmarkStatus:
    """The sweep could not be started yet (the API server failed a call, a permission is missing...): it
    stays Pending, says why, and is tried again; nothing ran, so nothing is lost by waiting."""
    message = collect.clean_reason(f"not started yet: {reason}; the operator tries again every "
                                   f"{retry_seconds:g} s")
    return BenchmarkStatus(phase=PENDING, message=message, observed_generation=generation, runs_total=0,
                           runs_done=0, runs=[], conditions=sweep_conditions([], PENDING, message, [], generation, now))


def replacing(stored: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch that makes `stored` equal `new`: keys `new` lacks are removed (null), nothing stale stays."""
    return {**{key: None for key in stored if key not in new}, **new}


def spec_unreadable_condition(reason: str, now: str, generation: int | None) -> Condition:
    return condition(SPEC_UNREADABLE, "True", "PinnedSpecUnreadable", reason, now, generation)


def spec_readable_condition(version: str, now: str, generation: int | None) -> Condition:
    return condition(SPEC_UNREADABLE, "False", "PinnedSpecRead", f"operator {version} reads the pinned spec",
                     now, generation)


def unreadable_reason(version: str, pinned_by: str | None, what: str) -> str:
    """Why an operator holds a sweep whose pinned state it cannot read, and what the user can do."""
    by = f"operator {pinned_by}" if pinned_by else "an earlier operator version"
    return collect.clean_reason(
        f"held: this operator ({version}) cannot read the sweep's pinned state (pinned by {by}): {what}. Nothing "
        f"is created or collected until an operator that reads it runs again ({by}); jobs already running go on. "
        f"Or delete the GPT2Benchmark and create it again to run it with this version")


def condition(type_: str, status: str, reason: str, message: str, now: str,
              generation: int | None = None) -> Condition:
    return Condition(type=type_, status=status, reason=reason, message=message, last_transition_time=now,
                     observed_generation=generation)


def set_condition(conditions: list[Condition], new: Condition) -> list[Condition]:
    """Replace the condition of the same type, keeping lastTransitionTime when the status is unchanged
    (`meta.SetStatusCondition`'s rule); the list keeps its order, new types are appended."""
    result, replaced = [], False
    for old in conditions or []:
        if old.type == new.type:
            if old.status == new.status:
                new = new.model_copy(update={"last_transition_time": old.last_transition_time})
            result.append(new)
            replaced = True
        else:
            result.append(old)
    return result if replaced else result + [new]


def sweep_conditions(existing: list[Condition], phase: str, message: str, runs: list[RunStatus],
                     generation: int | None, now: str) -> list[Condition]:
    """Ready, Complete, Failed, Finished and Queued for this phase, as batch Jobs have them.

    - Ready: True once there are results to read (Succeeded or PartiallySucceeded), reason the phase;
    - Complete: True when every run finished and at least one has results;
    - Failed: True when no run succeeded, or the spec is invalid (reason NoRunSucceeded / InvalidSpec);
    - Finished: True once the sweep ended, whichever way (Succeeded, PartiallySucceeded, Failed, Invalid; reason
      the phase): `kubectl wait --for=condition=Finished` comes back either way, where waiting for Complete
      would hang until its timeout on a failed sweep;
    - Queued: True while a run's job is suspended (Kueue has not admitted it yet).
    """
    results = phase in (SUCCEEDED, PARTIALLY_SUCCEEDED)
    failed = phase in (FAILED, INVALID)
    why = "InvalidSpec" if phase == INVALID else phase
    queued = [r.name for r in runs if r.phase == QUEUED]
    queued_message = (f"job suspended, waiting for its queue: {', '.join(queued)}" if queued
                      else "no run is waiting for its queue")
    wanted = [
        (READY, results, why),
        (COMPLETE, results, why),
        (FAILED_CONDITION, failed, "NoRunSucceeded" if phase == FAILED else why),
        (FINISHED_CONDITION, phase in FINISHED_PHASES, phase),
        (QUEUED_CONDITION, bool(queued), "JobSuspended" if queued else "NotQueued"),
    ]
    conditions = list(existing or [])
    for type_, true, reason, in wanted:
        text = queued_message if type_ == QUEUED_CONDITION else message
        conditions = set_condition(conditions, condition(type_, "True" if true else "False", reason, text, now,
                                                         generation))
    return conditions


def summarize(status: BenchmarkStatus, runs: list[RunStatus], now: str,
              spec: GPT2BenchmarkSpec | None = None) -> BenchmarkStatus:
    """The status fields these runs decide: counts, best, overall phase, conditions, completionTime, and,
    once every run is done, the analysis (recommendations, scaling, findings; `spec` gives the prices)."""
    tally = sweepcore.tally(runs, rounds=False)
    done, succeeded, phase = tally.done, tally.succeeded, tally.phase
    active = [r.name for r in runs if r.phase == RUNNING]
    queued = [r.name for r in runs if r.phase == QUEUED]
    if phase == RUNNING:
        message = f"{done}/{len(runs)} runs done" + (f"; running {', '.join(active)}" if active else "")
        message += f"; queued {', '.join(queued)} (job suspended)" if queued else ""
        held = sum(1 for r in runs if holds.held(r))
        message += f"; {held} held (condition {holds.RUNS_HELD})" if held else ""
    else:
        message = f"{succeeded}/{len(runs)} runs succeeded" + (f", {tally.skipped} skipped" if tally.skipped else "")
    generation = status.observed_generation
    return BenchmarkStatus(
        phase=phase,
        message=message,
        runs=runs,
        runs_total=tally.total,
        runs_done=done,
        runs_succeeded=succeeded,
        runs_failed=tally.failed,
        runs_skipped=tally.skipped,
        best=tally.best,
        waiting=waiting_message(runs),
        analysis=None if phase == RUNNING else _analyze(runs, spec),
        conditions=held_condition(sweep_conditions(status.conditions or [], phase, message, runs, generation, now),
                                  runs, generation, now),
        completion_time=now if phase != RUNNING and not status.completion_time else None,
    )


def held_condition(conditions: list[Condition], runs: list[RunStatus], generation: int | None,
                   now: str) -> list[Condition]:
    """RunsHeld: True while runs are held by a cause they share (its message: how many, why, how to go on);
    False once none is; absent from a sweep that never held one."""
    held = holds.summary(runs)
    if held is None and not any(c.type == holds.RUNS_HELD for c in conditions):
        return conditions
    why = "SharedCause" if held else "NoneHeld"
    return set_condition(conditions, condition(holds.RUNS_HELD, "True" if held else "False", why,
                                               held or "no run is held", now, generation))


def waiting_message(runs: list[RunStatus]) -> str:
    """What the active runs wait for, `run: what` each, after the held runs' cause ("" when none waits: a merge
    patch then clears it): `kubectl get`'s Waiting column."""
    held = holds.summary(runs)
    text = "; ".join([*([held] if held else []),
                      *(f"{r.name}: {r.waiting}" for r in runs if r.waiting and r.phase in (RUNNING, QUEUED))])
    return text if len(text) <= STATUS_REASON_LIMIT else text[: STATUS_REASON_LIMIT - 3] + "..."


def _analyze(runs: list[RunStatus], spec: GPT2BenchmarkSpec | None) -> Any:
    # Imported when a sweep finishes, not at start-up: the analysis pulls in scipy (~2 s here), and an
    # operator restarted after a crash should serve its sweeps again as soon as it can (docs/reliability.md).
    from gpt2bench.report.analysis import analyze

    return analyze(runs, spec_document(spec) if spec else None)


def spec_ignored_condition(generation: int, observed: int | None, now: str) -> Condition:
    """A started sweep keeps the spec it started with: say so, and how to run the new one."""
    message = (f"spec changed (generation {generation}) after the sweep started; the sweep keeps running with "
               f"generation {observed}'s spec. Create a new GPT2Benchmark to run the changed one.")
    return condition(SPEC_CHANGE_IGNORED, "True", "SweepAlreadyStarted", message, now, generation)


def after_step(status: BenchmarkStatus, runs: list[RunStatus], rounds: sweepcore.Rounds, generation: int,
               version: str, now: str, spec: GPT2BenchmarkSpec | None) -> BenchmarkStatus:
    """The status a Running sweep's step writes: `summarize`'s, the rounds (`racing`: 0 once nothing runs on; with
    fixed rounds, every configuration), SpecChangeIgnored once the spec was edited after the start, and
    SpecUnreadable back to False once this operator `version` reads the pinned spec."""
    summary = summarize(status, runs, now, spec)
    summary.rounds_planned, summary.rounds_done, summary.stop_reason = rounds.planned, rounds.done, rounds.stop_reason
    summary.racing, summary.dropped = rounds.racing, rounds.dropped
    if summary.phase != RUNNING:
        summary.racing = 0  # nothing runs on
    elif summary.racing is None:  # fixed rounds: every configuration runs every round
        summary.racing = len({configuration_of(entry) for entry in runs})
    observed = status.observed_generation or 0
    if generation > observed:  # written here, not by the update handler: one writer while Running
        summary.conditions = set_condition(summary.conditions or [], spec_ignored_condition(generation, observed, now))
    if any(c.type == SPEC_UNREADABLE and c.status == "True" for c in summary.conditions or []):
        summary.conditions = set_condition(summary.conditions or [], spec_readable_condition(version, now, generation))
    return summary
