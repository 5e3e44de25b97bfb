"""The fault suite's figures (docs/reliability.md's tables): every test marked `faults` adds what it measured
under its fault's name; at the end of the session (tests/conftest.py) they are printed and, when
$GPT2BENCH_FAULTS_JSON is set, merged into that file, so one `pytest -m faults` run writes every row's figures
whichever test file measured them (`-n` workers each merge theirs)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

FIGURES: dict[str, dict[str, Any]] = {}


def seconds_since(start: float) -> float:
    """Seconds since a `time.monotonic()` reading, to 0.01 s (the tests poll every 0.1 s)."""
    return round(time.monotonic() - start, 2)


def write() -> None:
    if not FIGURES:
        return
    text = json.dumps(FIGURES, indent=2, sort_keys=True)
    print("\nfault-injection figures:\n" + text)
    if os.environ.get("GPT2BENCH_FAULTS_JSON"):
        path = Path(os.environ["GPT2BENCH_FAULTS_JSON"])
        merged = json.loads(path.read_text()) if path.exists() and path.stat().st_size else {}
        path.write_text(json.dumps({**merged, **FIGURES}, indent=2, sort_keys=True) + "\n")
