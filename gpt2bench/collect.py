"""Turn what a run left behind into its `status.runs[]` entry (`gpt2bench.status.RunStatus`).

Sources, all ending in the trainer's compact summary:
- a pod's termination message: the summary JSON the trainer (or `gpt2bench launch`) wrote, or, under
  `FallbackToLogsOnError`, the tail of the logs with a `GPT2BENCH_SUMMARY {json}` line in it;
- a process's stdout (local runner);
- `summary.json` in the run's output folder.

The entry is the same `RunStatus` in the CR status and in `results.json`. Garbage never raises past
`collect_run`: a run without a readable summary is Failed with a reason saying what was wrong.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import zlib
from typing import Any

from gpt2bench.conventions import MAX_STEPS_JSON, STEPS_COLUMNS, STEPS_PREFIX, SUMMARY_PREFIX
from gpt2bench.status import FAILED, SKIPPED, SUCCEEDED, RunResults, RunStatus

MAX_REASON = 1000  # status stays small; a reason is a sentence, not a log


class CollectError(ValueError):
    """No usable trainer summary; the message is the run's failure reason."""


def camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _decode(text: str, where: str) -> dict[str, Any]:
    try:
        summary = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CollectError(f"{where}: trainer summary is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(summary, dict):
        raise CollectError(f"{where}: trainer summary is a {type(summary).__name__}, not an object")
    return summary


def summary_json(line: str) -> str | None:
    """The JSON text after the `GPT2BENCH_SUMMARY ` marker of one output line, or None without a marker.

    The marker may follow a prefix (mpirun's `[1,0]<stdout>:`, a log timestamp) and the object may be
    followed by noise (Open MPI's --tag-output can glue the next tag onto the line): both are cut off.
    """
    at = line.find(SUMMARY_PREFIX)
    if at < 0:
        return None
    rest = line[at + len(SUMMARY_PREFIX) :].strip()
    try:
        _, end = json.JSONDecoder().raw_decode(rest)
    except json.JSONDecodeError:
        return rest  # let the caller report what is wrong with it
    return rest[:end]


def find_summary_line(text: str, where: str = "output") -> dict[str, Any]:
    """The last `GPT2BENCH_SUMMARY {json}` line of some output, decoded."""
    found = [json_text for json_text in map(summary_json, text.splitlines()) if json_text is not None]
    if not found:
        raise CollectError(f"{where}: no {SUMMARY_PREFIX.strip()} line ({_tail(text)})")
    return _decode(found[-1], where)


def parse_termination_message(message: str | None) -> dict[str, Any]:
    """The trainer summary from a container's termination message (JSON, or a log tail with the line)."""
    text = (message or "").strip()
    if not text:
        raise CollectError("termination message is empty")
    if text.startswith("{"):
        return _decode(text, "termination message")
    return find_summary_line(text, "termination message")


def _tail(text: str, lines: int = 3) -> str:
    last = [line.strip() for line in text.strip().splitlines()[-lines:] if line.strip()]
    return "last output: " + " | ".join(last) if last else "no output"


def _number(value: Any) -> float | int | None:
    """A finite number, or None: NaN and infinities are not JSON a Kubernetes status can hold."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def summary_results(summary: dict[str, Any]) -> RunResults:
    """The `results` figures from a trainer summary (snake_case or camelCase keys); the rest is left."""
    flat = {camel(key): value for key, value in summary.items()}
    results: dict[str, Any] = {}
    for name, field in RunResults.model_fields.items():
        raw = flat.get(field.alias or name)
        if isinstance(raw, dict):  # per kind (bytes per collective): the run's total
            raw = sum(v for v in raw.values() if _number(v) is not None) if raw else None
        if field.annotation == str | None:
            value = clean_reason(raw)[:200] if isinstance(raw, str) and raw.strip() else None
        elif field.annotation == bool | None:
            value = raw if isinstance(raw, bool) else None
        else:
            value = _number(raw)
            value = int(value) if value is not None and field.annotation == int | None else value
        if value is not None:
            results[name] = value
    return RunResults(**results)


def summary_failure(summary: dict[str, Any]) -> str | None:
    """The trainer's own failure reason, or None when it says it succeeded (or skipped the run)."""
    status = str(summary.get("status", "ok")).lower()
    if status in ("ok", "succeeded", "success", "completed", "skipped"):
        return None
    return str(summary.get("reason") or f"trainer reported status {status!r}")


def run_entry(
    run: Any,
    *,
    phase: str,
    job_name: str | None = None,
    start_time: str | None = None,
    completion_time: str | None = None,
    reason: str | None = None,
    results: RunResults | None = None,
) -> RunStatus:
    """One `runs[]` entry. `run` is a plan.Run (or anything with its fields)."""
    return RunStatus(
        name=run.name,
        strategy=run.strategy.name,
        precision=run.precision,
        nodes=run.nodes,
        devices_per_node=run.devices_per_node,
        processes_per_node=run.procs_per_node,
        job_kind=run.job_kind,
        job_name=job_name or getattr(run, "job_name", run.name),  # a TrainJob's may be shorter (plan.Run.job_name)
        devices=run.nodes * run.devices_per_node if run.devices_per_node else run.world_size,
        repeat=getattr(run, "repeat", None),
        profile=getattr(run, "profile", False) or None,
        phase=phase,
        start_time=start_time,
        completion_time=completion_time,
        reason=(clean_reason(reason or "") or f"{phase.lower()} without a reason") if phase in (FAILED, SKIPPED)
        else None,
        results=(results or RunResults()) if phase == SUCCEEDED else None,
    )


def entry_from_summary(run: Any, summary: dict[str, Any], **times: str | None) -> RunStatus:
    """Succeeded with the figures, Skipped when the trainer chose not to train (e.g. emulated bf16), or Failed
    with the trainer's reason."""
    if str(summary.get("status", "")).lower() == "skipped":
        return run_entry(run, phase=SKIPPED, reason=str(summary.get("reason") or ""), **times)
    failure = summary_failure(summary)
    if failure:
        return run_entry(run, phase=FAILED, reason=failure, **times)
    results = summary_results(summary)
    if results.tokens_per_second is None:
        return run_entry(run, phase=FAILED, reason="trainer summary has no tokensPerSecond", **times)
    return run_entry(run, phase=SUCCEEDED, results=results, **times)


def collect_run(
    run: Any,
    *,
    job_succeeded: bool,
    termination_message: str | None,
    job_reason: str | None = None,
    cause: str | None = None,
    **times: str | None,
) -> RunStatus:
    """The entry of a finished job from its result pod's termination message.

    A job that failed stays Failed whatever the message says. Its reason: the trainer's reason, which says
    what went wrong inside the training, when the first pod that failed (`cause`: gpt2bench.diagnosis) said
    just that, or none did; else `job_reason` (the cause and the job controller's words: the result pod's
    trainer may only have seen a peer go); else the job's condition message.
    """
    try:
        summary = parse_termination_message(termination_message)
    except CollectError as exc:
        if job_succeeded:
            return run_entry(run, phase=FAILED, reason=f"job succeeded but {exc}", **times)
        return run_entry(run, phase=FAILED, reason=job_reason or cause or str(exc), **times)
    if not job_succeeded:
        trainer_said = summary_failure(summary)
        if cause and not (trainer_said and trainer_said in cause):  # another pod failed first
            reason = job_reason or cause
        else:  # the trainer's own reason is the whole story (the pod that failed first only said it)
            reason = trainer_said or job_reason or "job failed after the trainer finished"
        return run_entry(run, phase=FAILED, reason=reason, **times)
    return entry_from_summary(run, summary, **times)


def clean_reason(text: str) -> str:
    """One line, no control characters: reasons end up in `kubectl get -o yaml` and tables."""
    return re.sub(r"\s+", " ", re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", text)).strip()[:MAX_REASON]


# ---------------------------------------------------------------- per-step records (GPT2BENCH_STEPS)


def decode_steps(payload: str) -> list[dict[str, Any]]:
    """Step records from the text after `GPT2BENCH_STEPS ` (base64 of gzip of `{column: [values]}`).
    Raises CollectError on anything else (including more than MAX_STEPS_JSON bytes once inflated)."""
    try:
        packed = base64.b64decode(payload.strip(), validate=True)
        inflater = zlib.decompressobj(wbits=31)  # gzip framing
        text = inflater.decompress(packed, MAX_STEPS_JSON + 1)
        columns = json.loads(text) if len(text) <= MAX_STEPS_JSON and inflater.eof else None
    except (binascii.Error, zlib.error, ValueError) as exc:
        raise CollectError(f"steps line is not base64 gzip JSON: {exc}") from None
    if not isinstance(columns, dict) or not isinstance(columns.get("step"), list):
        raise CollectError("steps line is too large or has no step column")
    names = [name for name in STEPS_COLUMNS if isinstance(columns.get(name), list)]
    length = len(columns["step"])
    if any(len(columns[name]) != length for name in names):
        raise CollectError("steps line columns differ in length")
    return [{name: columns[name][i] for name in names} for i in range(length)]


def find_steps(text: str) -> list[dict[str, Any]] | None:
    """The step records of the last `GPT2BENCH_STEPS` line of some output (a log tail), or None when there
    is none or it cannot be read: the curves are a bonus, never a reason to fail a run."""
    lines = [line for line in text.splitlines() if STEPS_PREFIX in line]
    if not lines:
        return None
    try:
        return decode_steps(lines[-1].split(STEPS_PREFIX, 1)[1])
    except CollectError:
        return None


def steps_jsonl(records: list[dict[str, Any]]) -> str:
    """Records as steps.jsonl text (the trainer's file format, these columns only)."""
    return "".join(json.dumps(record, separators=(",", ":")) + "\n" for record in records)
