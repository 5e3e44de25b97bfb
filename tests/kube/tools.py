"""Where the tests find kubectl: where `scripts/install.sh --test` puts it (.tools/bin, from the same PyPI wheel
as helm), else the first on PATH. A stock machine has no kubectl at a fixed path (its official install goes to
/usr/local/bin, Debian's packages have none): never assume one (tests/test_layout.py fails on a hard-coded path).
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = ROOT / ".tools" / "bin"  # scripts/install.sh --test: helm and kubectl


def find_kubectl(installed: Path = INSTALLED, path: str | None = None) -> str | None:
    """installed/kubectl when it is there and executable, else `kubectl` on `path` (default $PATH); None."""
    candidate = installed / "kubectl"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which("kubectl", path=path)


@functools.cache
def kubectl() -> str:
    """The kubectl the tests run; a test that needs one fails saying how to get it."""
    found = find_kubectl()
    if found is None:
        pytest.fail(f"kubectl is neither in {INSTALLED} nor on PATH: run scripts/install.sh --test (make test does)")
    return found


def path_with_kubectl(path: str | None = None) -> str:
    """`path` (default $PATH) with the tests' kubectl's folder first: for commands that run `kubectl` by name
    (the NOTES' and README's lines, scripts/e2e-kind.sh)."""
    return os.pathsep.join([os.path.dirname(kubectl()), path if path is not None else os.environ.get("PATH", "")])
