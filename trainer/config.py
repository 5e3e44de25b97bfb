"""`gpt2bench train` options: the GPT2Benchmark spec's own sections, plus what only a process needs.

Each training option is declared once, in `gpt2bench.specification.model`: `TrainConfig.model` is a `ModelSpec`,
`.data` a `DataSpec`, `.training` a `TrainingSpec` and `.strategy` a `StrategySpec`, so an option's type,
bounds, default, help text and cross-field rules are the spec's, in the CRD, in `gpt2bench render` and
here alike. `ProcessOptions` holds what only a trainer process has (output folder, metrics port, labels,
device, test hooks).

The command line is generated from those fields: one flag per field, named after it (`--seq-len`,
`--bucket-cap-mb`, `--reshard-after-forward/--no-reshard-after-forward`), except the three named after
their section (`--strategy`, `--model`, `--data`). The plan writes a run's flags with `to_argv()`, the
inverse of `from_argv()`. A bad value raises `ConfigError` naming the flag (exit code 2).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from gpt2bench.specification.model import (
    DataSpec,
    MetricsPort,
    ModelSpec,
    Precision,
    StrategySpec,
    TrainingSpec,
    seq_len_error,
)


class ConfigError(ValueError):
    """A bad option; `option` is the flag as typed on the command line."""

    def __init__(self, option: str, message: str):
        self.option = option
        super().__init__(f"{option}: {message}")


class ProcessOptions(BaseModel):
    """What a trainer process needs besides the spec: where to write, what to serve, how to label."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    output: str = Field("gpt2bench-output", description="folder for steps.jsonl and summary.json")
    metrics_port: Literal[0] | MetricsPort = Field(
        0, description="Prometheus port, 0 = off (local rank r serves on port + r)")
    benchmark: str = Field("local", description="benchmark label for metrics")
    run: str = Field("local", description="run label for metrics (under torchrun put `--` before gpt2bench: "
                                          "torchrun would take a bare --run for an abbreviation of its --run-path)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where workers train")
    peak_flops: float | None = Field(None, gt=0, description="device peak FLOP/s for MFU (overrides the GPU table)")
    log_every: int = Field(10, ge=1, description="read the steps' figures back, log and export them every N steps "
                                                 "and at the last (the loop's only host sync; a non-finite loss is "
                                                 "seen there)")
    breakdown: bool = Field(True, description="time each step's phases (data, forward, backward, optimizer) and "
                                              "its communication, total and exposed, with bytes and bus bandwidth "
                                              "per collective (docs/metrics.md, Step breakdown); off: no timing "
                                              "hooks, the breakdown fields are null")
    probe_collectives: bool = Field(True, description="with --breakdown, after the last step: time each collective "
                                                      "kind the strategy used at its mean message size on the same "
                                                      "group (nccl-tests' busbw; summary probe_bus_bandwidth)")
    fail_at_step: int | None = Field(None, ge=1, description="test hook: the first worker raises at this step")
    nan_at_step: int | None = Field(None, ge=1, description="test hook: the loss becomes NaN at this step")
    hang_at_step: int | None = Field(None, ge=1, description="test hook: the first worker stops making progress "
                                                             "at this step, alive (its peers wait in their "
                                                             "collectives until --timeout-seconds)")
    slow_worker_seconds: float | None = Field(None, gt=0, description="test hook: the last worker sleeps this long "
                                                                      "in every step")
    nccl_log: str | None = Field(None, min_length=1, description="test hook: read this file as this rank's NCCL log "
                                                              "(on CPU too), as if NCCL had written it: the "
                                                              "transport record and the first step's fabric check")
    comm_delay_seconds: float | None = Field(None, gt=0, description="test hook: under ddp with --breakdown, "
                                                                     "every step's last gradient all-reduce "
                                                                     "completes this much later (a slow network)")


class TrainConfig(BaseModel):
    """Everything one `gpt2bench train` process is told. Frozen: built once, from flags or from a run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    strategy: StrategySpec = StrategySpec(name="single")
    precision: Precision = Field("fp32", description="fp32 | fp16 (autocast + GradScaler) | bf16 (autocast); "
                                                      "the recipes: docs/strategies.md")
    model: ModelSpec = ModelSpec()
    data: DataSpec = DataSpec()
    training: TrainingSpec = TrainingSpec()
    process: ProcessOptions = ProcessOptions()

    @model_validator(mode="after")
    def _across_sections(self) -> TrainConfig:
        problem = seq_len_error(self.model, self.training)
        if problem:
            raise ValueError(f"seqLen: {problem}")
        return self

    @property
    def tokens_per_step_per_worker(self) -> int:
        return self.training.micro_batch_size * self.training.grad_accum * self.training.seq_len

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def config_hash(self) -> str:
        """Hash of what determines the numbers (the process options: labels, paths, ports, hooks, left out)."""
        # the process-group timeout only bounds a failure: it changes no figure of a run that succeeds
        relevant = self.model_dump(mode="json", exclude={"process": True, "training": {"timeout_seconds"}})
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]

    # ----------------------------------------------------------------- the command line
    @classmethod
    def from_argv(cls, argv: list[str]) -> TrainConfig:
        """Parse flags. argparse exits 2 naming an unknown or malformed flag; a bad value raises ConfigError."""
        values = vars(build_parser().parse_args(argv))
        nested: dict[str, Any] = {}
        for option in OPTIONS:
            if option.dest in values:
                option.put(nested, values[option.dest])
        try:
            return cls.model_validate(nested)
        except ValidationError as exc:
            raise _config_error(exc) from None

    def to_argv(self) -> list[str]:
        """The flags that make `from_argv` rebuild this config. Every value is written, defaults too: a
        rendered job states all it depends on, whatever the defaults of the trainer image it runs in."""
        argv: list[str] = []
        for option in OPTIONS:
            value = option.get(self)
            if value is None:
                continue
            if isinstance(value, bool):
                argv.append(option.flag if value else "--no-" + option.flag[2:])
            else:
                argv += [option.flag, str(value)]
        return argv


# ---------------------------------------------------------------------- flags from the models
_SECTION_FLAGS = {("strategy", "name"): "--strategy", ("model", "preset"): "--model", ("data", "source"): "--data"}


@dataclass(frozen=True)
class Option:
    """One flag: the field it sets (`section` None for TrainConfig's own `precision`)."""

    section: str | None
    field: str
    flag: str
    annotation: Any
    default: Any
    help: str | None

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    def get(self, config: TrainConfig) -> Any:
        return getattr(getattr(config, self.section), self.field) if self.section else getattr(config, self.field)

    def put(self, nested: dict[str, Any], value: Any) -> None:
        if self.section:
            nested.setdefault(self.section, {})[self.field] = value
        else:
            nested[self.field] = value


def _options() -> list[Option]:
    defaults = TrainConfig()
    options = []
    for section, field in TrainConfig.model_fields.items():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            for name, info in model.model_fields.items():
                flag = _SECTION_FLAGS.get((section, name), "--" + name.replace("_", "-"))
                default = getattr(getattr(defaults, section), name)
                options.append(Option(section, name, flag, info.annotation, default, info.description))
        else:
            default = getattr(defaults, section)
            options.append(Option(None, section, "--" + section, field.annotation, default, field.description))
    flags = [o.flag for o in options]
    if len(set(flags)) != len(flags):  # a new spec field named like one in another section
        raise RuntimeError(f"two options share a flag: {sorted(f for f in flags if flags.count(f) > 1)}")
    return options


OPTIONS = _options()
_BY_FIELD = {(o.section, o.field): o for o in OPTIONS}


def _allowed(annotation: Any) -> tuple[list[type], list[Any]]:
    """(Python types, Literal values) a field's annotation allows: unions opened, Annotated unwrapped."""
    kinds, values, todo = [], [], [annotation]
    while todo:
        item = todo.pop()
        origin = typing.get_origin(item)
        if origin is typing.Annotated:
            todo.append(typing.get_args(item)[0])
        elif origin in (typing.Union, types.UnionType):
            todo.extend(typing.get_args(item))
        elif origin is Literal:
            values.extend(typing.get_args(item))
        elif item is not type(None):
            kinds.append(item)
    return kinds, values


def _argument(option: Option) -> dict[str, Any]:
    """argparse keywords for a field: bool → --x/--no-x, only Literal values → choices, else its type."""
    kinds, values = _allowed(option.annotation)
    default = f" (default {option.default})" if option.default is not None else ""
    keywords: dict[str, Any] = {"help": (option.help or "").rstrip(".") + default}
    if kinds == [bool]:
        keywords["action"] = argparse.BooleanOptionalAction
    elif not kinds:
        keywords["choices"] = values
    elif int in kinds or float in kinds:
        keywords["type"] = int if int in kinds else float  # Literal[0] | port: an int either way
    return keywords


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpt2bench train", description="Train GPT-2 under one data-parallel "
                                     "strategy.", allow_abbrev=False, argument_default=argparse.SUPPRESS)
    for option in OPTIONS:
        parser.add_argument(option.flag, **_argument(option))
    return parser


def parse_config(argv: list[str]) -> TrainConfig:
    return TrainConfig.from_argv(argv)


def _config_error(exc: ValidationError) -> ConfigError:
    """The first problem, named by its flag. Model validators name the field in camelCase first
    (`warmupSteps: ...`), as in the spec; field errors carry it in their location."""
    error = exc.errors()[0]
    loc = [part for part in error["loc"] if isinstance(part, str)]
    message = error["msg"].removeprefix("Value error, ")
    section = loc[0] if loc and loc[0] in TrainConfig.model_fields else None
    named, _, rest = message.partition(": ")
    by_camel = {(o.section, to_camel(o.field)): o for o in OPTIONS}
    candidates = [section] if section else [o.section for o in OPTIONS]
    for candidate in candidates:
        if (candidate, named) in by_camel:
            return ConfigError(by_camel[(candidate, named)].flag, rest)
    if section and len(loc) > 1 and (section, loc[1]) in _BY_FIELD:
        return ConfigError(_BY_FIELD[(section, loc[1])].flag, message)
    if loc and (None, loc[0]) in _BY_FIELD:
        return ConfigError(_BY_FIELD[(None, loc[0])].flag, message)
    return ConfigError("--" + (section or "options"), message)
