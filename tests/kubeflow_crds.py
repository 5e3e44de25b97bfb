"""Validate rendered jobs against the upstream Kubeflow CRDs, as a strict API server would.

`validate_job(job)` raises `JobInvalid` listing every problem. On top of jsonschema against the CRD's
`openAPIV3Schema` (OpenAPI 3.0 is draft-4 style), it rejects unknown fields the way
`kubectl apply --validate=strict` does (the upstream schemas do not say `additionalProperties: false`,
an API server prunes or rejects instead), and checks the replica types and enum-like strings that the
upstream schemas leave as free text but the Kubeflow operators reject.

Trainer v2 (TrainJob, ClusterTrainingRuntime, JobSet) is checked the same way, plus what its CRDs say in
CEL and its webhooks enforce, which jsonschema cannot see (`trainer_v2_problems`).

Other tests may import it: `from kubeflow_crds import validate_job` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from kube.semantics import go_pattern

REPO = Path(__file__).resolve().parents[1]
CRD_FILES = {
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
    ("kubeflow.org/v2beta1", "MPIJob"): "kubeflow.org_mpijobs_v2beta1.yaml",
}
REPLICA_TYPES = {
    "PyTorchJob": ("pytorchReplicaSpecs", {"Master", "Worker"}),
    "MPIJob": ("mpiReplicaSpecs", {"Launcher", "Worker"}),
}
# Kubeflow Trainer v2.3.0 and the JobSet it installs (../shared/crds/trainer-v2/, see its README).
TRAINER_V2_CRD_FILES = {
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer-v2/trainer.kubeflow.org_trainjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): "trainer-v2/trainer.kubeflow.org_clustertrainingruntimes.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): "trainer-v2/trainer.kubeflow.org_trainingruntimes.yaml",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "trainer-v2/jobset.x-k8s.io_jobsets.yaml",
}
ALL_CRD_FILES = {**CRD_FILES, **TRAINER_V2_CRD_FILES}
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
CLEAN_POD_POLICIES = {"All", "Running", "None"}


class JobInvalid(AssertionError):
    pass


def crd_dir() -> Path:
    """Where the upstream CRDs are: $GPT2BENCH_KUBEFLOW_CRDS, else shared/crds beside or inside the checkout."""
    candidates = [
        os.environ.get("GPT2BENCH_KUBEFLOW_CRDS"),
        REPO.parent / "shared" / "crds",
        REPO / "tests" / "data" / "kubeflow-crds",  # a copy, for checkouts without ../shared
    ]
    for candidate in candidates:
        if candidate and (Path(candidate) / CRD_FILES[("kubeflow.org/v1", "PyTorchJob")]).is_file():
            return Path(candidate)
    raise FileNotFoundError(
        f"upstream Kubeflow CRDs not found in any of {candidates[1:]} (or $GPT2BENCH_KUBEFLOW_CRDS)"
    )


def strict(schema: Any) -> Any:
    """A copy of a CRD's OpenAPI schema that jsonschema enforces the way a strict API server does.

    Objects with declared properties reject unknown ones; `x-kubernetes-int-or-string` and `nullable`
    (Kubernetes/OpenAPI extensions jsonschema ignores) become the equivalent JSON Schema.
    """
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) if key not in ("enum", "default") else value for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if schema.get("x-kubernetes-int-or-string") and "anyOf" not in schema:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and isinstance(schema.get("type"), str):
        out["type"] = [schema["type"], "null"]
        if "enum" in schema:
            out["enum"] = [*schema["enum"], None]
    if isinstance(schema.get("pattern"), str):
        out["pattern"] = go_pattern(schema["pattern"])
    return out


@functools.cache
def job_validator(api_version: str, kind: str) -> jsonschema.Draft4Validator:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    document = yaml.load((crd_dir() / ALL_CRD_FILES[(api_version, kind)]).read_text(), Loader=loader)
    version = api_version.split("/")[1]
    (served,) = [v for v in document["spec"]["versions"] if v["name"] == version]
    return jsonschema.Draft4Validator(strict(served["schema"]["openAPIV3Schema"]))


def schema_problems(obj: dict[str, Any]) -> list[str]:
    """What the CRD's schema (strict: unknown fields too) says about `obj`."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in ALL_CRD_FILES:
        return [f"unknown kind {key}"]
    return [
        f"{'.'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
        for error in job_validator(*key).iter_errors(obj)
    ]


def job_problems(job: dict[str, Any], runtimes: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """`runtimes` (name -> ClusterTrainingRuntime) are what a TrainJob is checked against; default: the
    project's own (gpt2bench.render.runtimes)."""
    key = (job.get("apiVersion"), job.get("kind"))
    if key not in ALL_CRD_FILES:
        return [f"unknown job type {key}"]
    problems = schema_problems(job)
    if key in TRAINER_V2_CRD_FILES:
        from trainer_v2_rules import trainer_v2_problems

        return problems + trainer_v2_problems(job, runtimes)
    replica_field, allowed = REPLICA_TYPES[job["kind"]]
    spec = job.get("spec") or {}
    for replica_type, replica in (spec.get(replica_field) or {}).items():
        if replica_type not in allowed:
            problems.append(f"spec.{replica_field}.{replica_type}: not one of {sorted(allowed)}")
        if replica.get("restartPolicy", "Never") not in RESTART_POLICIES:
            problems.append(f"spec.{replica_field}.{replica_type}.restartPolicy: {replica['restartPolicy']!r}")
    clean = (spec.get("runPolicy") or {}).get("cleanPodPolicy", "None")
    if clean not in CLEAN_POD_POLICIES:
        problems.append(f"spec.runPolicy.cleanPodPolicy: {clean!r}")
    name = (job.get("metadata") or {}).get("name", "")
    if not (0 < len(name) <= 63):
        problems.append(f"metadata.name: {name!r} is not 1-63 characters")
    return problems


def validate_job(job: dict[str, Any], runtimes: dict[str, dict[str, Any]] | None = None) -> None:
    problems = job_problems(job, runtimes)
    if problems:
        raise JobInvalid(
            f"{job.get('kind')} {job.get('metadata', {}).get('name')!r} is invalid:\n  " + "\n  ".join(problems)
        )


def assert_each_mutation_rejected(job: dict[str, Any], cases) -> None:
    """Every (mutate, needle): the mutated copy of `job` gets a problem mentioning `needle` and is refused."""
    import copy

    for mutate, needle in cases:
        broken = copy.deepcopy(job)
        mutate(broken)
        problems = job_problems(broken)
        assert any(needle in p for p in problems), (needle, problems)
        try:
            validate_job(broken)
        except JobInvalid:
            continue
        raise AssertionError(f"validate_job accepted a job broken at {needle}")
