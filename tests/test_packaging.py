"""What `pip install .` (the Dockerfile's) ships: every package of the source tree, not only the editable view."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    # package-dir maps import names onto folders (gpt2bench.trainer -> trainer/); sub-folders follow their parent
    roots = {folder: name for name, folder in setuptools["package-dir"].items()}
    found = set()
    for root in roots:
        for init in (REPO / root).glob("**/__init__.py"):
            folder = init.parent.relative_to(REPO).as_posix()
            # the innermost mapped root names it (trainer/parallel is its own entry)
            owner = max((r for r in roots if folder == r or folder.startswith(r + "/")), key=len)
            found.add(roots[owner] + folder[len(owner):].replace("/", "."))
    assert found - listed == set(), "pip install . would leave these packages out of the image"
    assert listed - found == set()
