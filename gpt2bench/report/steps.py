"""Per-step records (the trainer's steps.jsonl) of a local results folder: the loss and grad-norm curves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpt2bench.status import ResultsDocument


def read_steps_line(line: str | bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


def read_steps(path: Path) -> list[dict[str, Any]]:
    """Step records from a steps.jsonl; a torn last line (run killed mid-write) is skipped."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [record for record in map(read_steps_line, f) if record is not None]
    except OSError:
        return []


def load_curves(doc: ResultsDocument, directory: Path) -> dict[str, list[dict[str, Any]]]:
    """Run name -> its step records, for the runs whose entry names a steps file (local runs only)."""
    return {run.name: read_steps(directory / run.steps_file) for run in doc.runs if run.steps_file}
