"""The live display of `gpt2bench run`: run i of N, and the current run's step, tokens/s and loss."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Self

from gpt2bench.conventions import STEPS_FILE
from gpt2bench.plan import Run
from gpt2bench.status import SKIPPED, SUCCEEDED, LocalRun, status_label


class StepsTail:
    """Reads a growing steps.jsonl: only complete lines, from where it stopped last time."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.offset = 0
        self.last: dict[str, Any] | None = None

    def poll(self, replicas_dir: Path) -> dict[str, Any] | None:
        if self.path is None:
            found = sorted(replicas_dir.glob(f"*/{STEPS_FILE}"))
            if not found:
                return self.last
            self.path = found[0]
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return self.last
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(record, dict):
                self.last = record
        return self.last


class Display:
    """rich progress: the sweep (run i of N) and the current run (step, tokens/s, loss)."""

    def __init__(self, console: Any, total_runs: int, steps: int, live: bool):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console, self.steps, self.live = console, steps, live
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
            disable=not live,
        )
        self.sweep = self.progress.add_task("sweep", total=total_runs, stats="")
        self.current = None
        self.tail = StepsTail()

    def __enter__(self) -> Self:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start_run(self, index: int, total: int, run: Run) -> None:
        self.tail = StepsTail()
        label = f"run {index + 1}/{total} {run.name}"
        if self.live:
            if self.current is not None:
                self.progress.remove_task(self.current)
            self.current = self.progress.add_task(label, total=self.steps, stats="starting")
        else:
            self.console.print(f"{label}: starting ({run.job_kind}, {run.nodes}x{run.procs_per_node})", markup=False)

    def tick(self, replicas_dir: Path) -> None:
        record = self.tail.poll(replicas_dir)
        if record is None or self.current is None:
            return
        tokens, loss = record.get("tokens_per_second"), record.get("loss")
        stats = (
            f"step {record.get('step')}  "
            f"{f'{tokens:,.0f}' if isinstance(tokens, (int, float)) else '?'} tok/s  "
            f"loss {f'{loss:.4f}' if isinstance(loss, (int, float)) else '?'}"
        )
        self.progress.update(self.current, completed=record.get("step") or 0, stats=stats)

    def end_run(self, entry: LocalRun, kept: bool = False) -> None:
        """One line for a run that ended (`kept`: one an earlier sweep finished, kept by --resume)."""
        self.progress.advance(self.sweep)
        line = f"{entry.name}: {'kept from the earlier sweep: ' if kept else ''}{status_label(entry)}"
        tokens = entry.results.tokens_per_second if entry.results else None
        if tokens is not None:
            line += f" ({tokens:,.0f} tokens/s)"
        style = {SUCCEEDED: "green", SKIPPED: "yellow"}.get(entry.phase, "red")
        # markup=False: a reason is the trainer's or the library's text, e.g. gloo's "[/path/unbound_buffer.cc:78]
        # Timed out", which rich would read as a closing tag and raise on
        self.console.print(line, style=style, highlight=False, markup=False)

    def round_added(self, runs: int, reason: str) -> None:
        """A round added until decided: the sweep's bar grows by its runs; one line says why."""
        total = self.progress.tasks[self.sweep].total or 0
        self.progress.update(self.sweep, total=total + runs)
        self.note(reason)

    def note(self, text: str) -> None:
        """A line between runs: a configuration dropped by its race, a round added, why the sweep stops."""
        self.console.print(text, highlight=False, markup=False)
