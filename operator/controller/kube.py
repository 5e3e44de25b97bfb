"""Small wrappers over the `kubernetes` client: the few calls the operator makes.

kopf watches the GPT2Benchmarks and the jobs; these functions create and read their children and write
a benchmark's status. What a job kind is (API, result pod) comes from `jobkinds`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from gpt2bench import __version__
from gpt2bench import jobkinds as kinds
from gpt2bench.conventions import BENCHMARK_LABEL, TRAINJOB_API
from gpt2bench.render import label_value
from gpt2bench.render.runtimes import (
    NAMESPACED_RUNTIME_KIND,
    NAMESPACED_RUNTIME_PLURAL,
    RUNTIME_KIND,
    RUNTIME_PLURAL,
    runtime_problems,
)
from gpt2bench.specification.model import API_GROUP, API_VERSION, PLURAL

from . import apiclient, decide
from .followedkinds import JOB_KINDS, FollowedKind, missing_kind_reason, missing_runtime_reason

_client: kubernetes.client.ApiClient | None = None
# Errors worth another try later (the API server or the network, not the request): 401 too, as it is the
# operator's credentials (e.g. a token being rotated), not the job.
TRANSIENT_STATUS = {0, 401, 408, 429, 500, 502, 503, 504}
TRANSIENT_ERRORS = (urllib3.exceptions.HTTPError, OSError)
PODS = "/api/v1/namespaces/{namespace}/pods"
EVENTS = "/api/v1/namespaces/{namespace}/events"
JOBS = "/apis/batch/v1/namespaces/{namespace}/jobs"
CONFIG_MAPS = "/api/v1/namespaces/{namespace}/configmaps"
NETWORK_POLICIES = "/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"


def configure(pool_size: int = 16, timeouts: apiclient.Timeouts | None = None) -> None:
    """In-cluster credentials when running in a pod, else $KUBECONFIG (read now) or ~/.kube/config.

    One ApiClient for the process: its connection pool is shared by the handler threads (a client per
    call would open a TCP connection per request). Every call it makes is bounded (`apiclient`: timeouts,
    Retry-After)."""
    global _client
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None,
                                           client_configuration=config)
    config.connection_pool_maxsize = pool_size
    _client = apiclient.ApiClient(config, timeouts or apiclient.Timeouts.of())
    _client.user_agent = f"gpt2bench-operator/{__version__}"  # tells our calls apart in API audit logs


def _api() -> kubernetes.client.ApiClient:
    if _client is None:
        configure()
    return _client


def _custom() -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(_api())


def request(method: str, path: str, path_params: dict[str, str], query: dict[str, Any] | None = None,
            body: Any = None) -> Any:
    """A core or networking API request by its path, as CoreV1Api and NetworkingV1Api make it (the same client:
    credentials, timeouts, Retry-After); the answer, read (`.data`). A non-2xx answer raises ApiException as
    theirs do. Those two classes are not imported: loading their methods (each a pydantic `validate_call`) took
    about 1.2 s of CPU at every operator start, for the handful of calls below."""
    client = _api()
    headers = {"Accept": "application/json", **({"Content-Type": "application/json"} if body is not None else {})}
    request = client.param_serialize(method, path, path_params=path_params, header_params=headers, body=body,
                                     query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
                                     auth_settings=["BearerToken"])
    response = client.call_api(*request)
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return response


def leases() -> kubernetes.client.CoordinationV1Api:
    """The Lease API (leader election, `leader.py`), on the operator's bounded client."""
    return kubernetes.client.CoordinationV1Api(_api())


def transient(exc: BaseException) -> bool:
    """An error to retry later, rather than a verdict on the request."""
    if isinstance(exc, ApiException):
        return exc.status in TRANSIENT_STATUS or exc.status >= 500
    return isinstance(exc, (*TRANSIENT_ERRORS, NotFoundYet))


def api_message(exc: ApiException) -> tuple[str, str]:
    """(reason, message) of an API error: the server's Status when it sent one, else the HTTP reason."""
    try:
        status = json.loads(exc.body or "")
    except (TypeError, ValueError):
        status = None
    if isinstance(status, dict) and status.get("message"):
        return str(status.get("reason") or exc.reason or ""), str(status["message"])
    return str(exc.reason or ""), str(exc.body or exc.reason or "")


# --- discovery ------------------------------------------------------------------------------------


def served_versions(group: str, plural: str) -> list[str]:
    """The versions of `group` that serve `plural` (discovery, which every authenticated user may read)."""
    try:
        versions = kubernetes.client.ApisApi(_api()).get_api_versions().groups
    except ApiException:
        return []
    found = []
    for api_group in versions or []:
        if api_group.name != group:
            continue
        for version in api_group.versions or []:
            try:
                resources = _custom().get_api_resources(group, version.version)
            except ApiException:
                continue
            if any(r.name == plural for r in (resources.resources or [])):
                found.append(version.version)
    return found


def served_job_kinds() -> set[str]:
    """The job kinds this cluster serves (discovery of each kind's group/version): what `backend: auto`
    chooses from. Raises on API errors other than 404, so kopf retries rather than choosing blind."""
    discovery: dict[str, list[str]] = {}
    for kind in JOB_KINDS.values():
        if kind.api_version in discovery:
            continue
        try:
            resources = _custom().get_api_resources(kind.group, kind.version)
        except ApiException as exc:
            if exc.status != 404:
                raise
            continue
        discovery[kind.api_version] = [r.name for r in (resources.resources or [])] if resources else []
    return kinds.served_job_kinds(discovery)


def runtimes_missing(names: list[str]) -> list[str]:
    """Of these ClusterTrainingRuntimes, those the cluster does not have (404); other errors raise."""
    group, version = TRAINJOB_API.split("/")
    missing = []
    for name in names:
        try:
            _custom().get_cluster_custom_object(group, version, RUNTIME_PLURAL, name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            missing.append(name)
    return missing


def served(kind: FollowedKind) -> bool:
    """Whether discovery lists `kind` at its version: what decides that a 404 on it means "not served". A 404
    alone does not: an API server instance whose CRD informer has not synced yet (behind a load balancer), or
    CRDs being re-applied during an upgrade, answer 404 for a kind the cluster serves. Errors other than a 404
    of discovery itself raise (a failed discovery says nothing)."""
    try:
        resources = _custom().get_api_resources(kind.group, kind.version)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(r.name == kind.plural for r in ((resources.resources if resources else None) or []))


class NotFoundYet(Exception):
    """A 404 on a kind that discovery says is served: transient, the call is tried again at the next step."""


def missing_reason(kind: FollowedKind) -> str:
    """Why `kind` cannot be created here: what the cluster serves instead, and what to install."""
    return missing_kind_reason(kind, [v for v in served_versions(kind.group, kind.plural) if v != kind.version])


# --- jobs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Created:
    """The job now exists and is ours: `new` when this call created it (else it was there, ours)."""

    new: bool


@dataclass(frozen=True)
class Refused:
    """The job cannot exist: the reason is the run's failure reason (`kind_missing`: the cluster does not
    serve the job's kind, so no job of that kind can)."""

    reason: str
    kind_missing: bool = False


def create_job(job: dict[str, Any], owner_uid: str | None) -> Created | Refused:
    """Create a rendered job. A 409 is ours when its controller is `owner_uid` (a job created just before a
    restart); a namesake of another owner, a kind the cluster does not serve and a job the API server
    refuses (403, 422, ...) are Refused with the reason. Transient errors raise (ApiException, urllib3)."""
    kind = JOB_KINDS[job["kind"]]
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    unfit_runtime = _runtime_refusal(job)
    if unfit_runtime:
        return unfit_runtime
    try:
        _custom().create_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural, job)
    except ApiException as exc:
        if transient(exc):
            raise
        if exc.status == 409:
            return _existing(kind, namespace, name, owner_uid)
        if exc.status == 404 and not served(kind):
            return Refused(missing_reason(kind), kind_missing=True)
        reason, message = api_message(exc)
        return Refused(decide.refused_reason(name, kind.kind, exc.status, reason, message))
    return Created(new=True)


def _runtime_refusal(job: dict[str, Any]) -> Refused | None:
    """A TrainJob whose ClusterTrainingRuntime is missing, refused saying what to install, or one the installed
    runtime cannot run as asked (runtime_problems: its sshd pods' image is not the run's, it does not
    gang-schedule a run that asks for it), refused saying why; None when it fits, or for other kinds. Trainer's
    webhook would refuse some with less to go on, and would let the others start half-right. Without Trainer v2
    at all, the kind is what is missing."""
    ref = kinds.runtime_ref(job)
    if not ref:
        return None
    group, version = TRAINJOB_API.split("/")
    if ref.get("kind") == NAMESPACED_RUNTIME_KIND:  # the benchmark's own, created just before (create_run)
        runtime = _custom().get_namespaced_custom_object(group, version, job["metadata"]["namespace"],
                                                         NAMESPACED_RUNTIME_PLURAL, ref["name"])
        problems = runtime_problems(job, runtime)
        return Refused("; ".join(problems)) if problems else None
    if ref.get("kind", RUNTIME_KIND) != RUNTIME_KIND:
        return None
    try:
        runtime = _custom().get_cluster_custom_object(group, version, RUNTIME_PLURAL, ref["name"])
    except ApiException as exc:
        if exc.status != 404:
            raise
        kind = JOB_KINDS[job["kind"]]
        if not served(kind):
            return Refused(missing_reason(kind), kind_missing=True)
        return Refused(missing_runtime_reason(RUNTIME_KIND, ref["name"]))
    problems = runtime_problems(job, runtime)
    return Refused("; ".join(problems)) if problems else None


def _existing(kind: FollowedKind, namespace: str, name: str, owner_uid: str | None) -> Created | Refused:
    existing = _custom().get_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural, name)
    if owner_uid is None or decide.controller_uid(existing) == owner_uid:
        return Created(new=False)
    return Refused(decide.foreign_reason(name, kind.kind, namespace, decide.owner_description(existing),
                                            owner_uid))


def _ours_or_refused(existing: dict[str, Any], kind: str, namespace: str, owner_uid: str | None,
                     consequence: str) -> Created | Refused:
    """An object a create met (409): ours when its controller is `owner_uid`, else Refused saying whose it is."""
    if owner_uid is None or decide.controller_uid(existing) == owner_uid:
        return Created(new=False)
    name = existing["metadata"]["name"]
    return Refused(f"a {kind} named {name} already exists in {namespace} and belongs to "
                   f"{decide.owner_description(existing)}, not to this GPT2Benchmark (uid {owner_uid}): {consequence}. "
                   f"Delete that {kind}, or give this benchmark another name")


def create_network_policy(policy: dict[str, Any], owner_uid: str | None) -> Created | Refused:
    """Create a run's NetworkPolicy (before its job). A 409 is ours when its controller is `owner_uid`; a
    namesake of another owner, or a policy the API server refuses (403: the operator's RBAC, 422), is
    Refused with the reason, so that no job starts without its policy. Transient errors raise."""
    namespace, name = policy["metadata"]["namespace"], policy["metadata"]["name"]
    try:
        request("POST", NETWORK_POLICIES, {"namespace": namespace}, body=policy)
    except ApiException as exc:
        if transient(exc):
            raise
        if exc.status == 409:
            response = request("GET", NETWORK_POLICIES + "/{name}", {"namespace": namespace, "name": name})
            return _ours_or_refused(json.loads(response.data), "NetworkPolicy", namespace, owner_uid,
                                    "the run's pods would be fenced by rules it does not set")
        reason, message = api_message(exc)
        return Refused(decide.refused_reason(name, "NetworkPolicy", exc.status, reason, message)
                       + " (spec.networkPolicy.enabled: false runs without it)")
    return Created(new=True)


def create_training_runtime(runtime: dict[str, Any], owner_uid: str | None) -> Created | Refused:
    """Create a benchmark's own TrainingRuntime (render.trainjob.claims_runtime), before the TrainJob that names it.
    Its runs share it: a 409 is fine when its controller is `owner_uid` (created for an earlier run, or before a
    restart); a namesake of another owner, a cluster that does not serve TrainingRuntimes (`kind_missing`: every
    TrainJob of the benchmark names one) and a runtime the API server refuses (403, 422) are Refused with the
    reason. Transient errors raise."""
    group, version = TRAINJOB_API.split("/")
    namespace, name = runtime["metadata"]["namespace"], runtime["metadata"]["name"]
    try:
        _custom().create_namespaced_custom_object(group, version, namespace, NAMESPACED_RUNTIME_PLURAL, runtime)
    except ApiException as exc:
        if transient(exc):
            raise
        if exc.status == 409:
            existing = _custom().get_namespaced_custom_object(group, version, namespace, NAMESPACED_RUNTIME_PLURAL,
                                                              name)
            return _ours_or_refused(existing, NAMESPACED_RUNTIME_KIND, namespace, owner_uid,
                                    "its pods would not be this run's")
        if exc.status == 404 and not served_versions(group, NAMESPACED_RUNTIME_PLURAL):
            return Refused(f"{NAMESPACED_RUNTIME_KIND} {TRAINJOB_API} is not served by this cluster: a TrainJob with "
                           f"resource claims (spec.pods.resourceClaims) runs on a {NAMESPACED_RUNTIME_KIND} of its "
                           f"benchmark's own; install Kubeflow Trainer v2 with its CRDs, or use backend pytorchjob",
                           kind_missing=True)
        reason, message = api_message(exc)
        return Refused(decide.refused_reason(name, NAMESPACED_RUNTIME_KIND, exc.status, reason, message))
    return Created(new=True)


def list_jobs(namespace: str, benchmark: str, kinds: set[str]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The jobs labelled with the benchmark's name, by job name, across `kinds`; and, for each kind the
    cluster does not serve (a 404 that discovery confirms), why (the failure reason of its runs). A 404 on a
    kind discovery serves raises NotFoundYet (transient)."""
    jobs: dict[str, dict[str, Any]] = {}
    missing: dict[str, str] = {}
    for name in sorted(kinds):
        kind = JOB_KINDS[name]
        try:
            listed = _custom().list_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural,
                label_selector=f"{BENCHMARK_LABEL}={label_value(benchmark)}",
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            if served(kind):
                raise NotFoundYet(f"listing {kind.kind} {kind.api_version} answered 404 though discovery serves "
                                  f"it (an API server whose CRDs have not synced?): tried again at the next step") \
                    from exc
            missing[name] = missing_reason(kind)
            continue
        for item in listed.get("items", []):
            item.setdefault("kind", name)  # what the result pod and the conditions are read by
            jobs[item["metadata"]["name"]] = item
    return jobs, missing


# --- the benchmark ------------------------------------------------------------------------------------


def get_benchmark(namespace: str, name: str) -> dict[str, Any] | None:
    """The GPT2Benchmark as stored now (a timer's body can trail the last status patch)."""
    try:
        return _custom().get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _precondition(resource_version: str | None) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": resource_version}} if resource_version else {}


def patch_status(namespace: str, name: str, status: dict[str, Any], resource_version: str | None = None
                 ) -> dict[str, Any]:
    """Merge-patch the benchmark's status (lists such as `runs` and `conditions` are replaced whole); with
    `resource_version` (that of the benchmark the step read), only if it is still that version: the API server
    answers 409 Conflict when another writer came first, and the step runs again on what is stored now, so no
    update is lost. Returns the benchmark as written."""
    return _custom().patch_namespaced_custom_object_status(API_GROUP, API_VERSION, namespace, PLURAL, name,
                                                            {**_precondition(resource_version), "status": status})


def annotate_benchmark(namespace: str, name: str, annotations: dict[str, str], resource_version: str | None = None
                       ) -> dict[str, Any]:
    """Merge-patch the benchmark's annotations (the pinned spec), conditional as `patch_status`."""
    patch = _precondition(resource_version)
    patch.setdefault("metadata", {})["annotations"] = annotations
    return _custom().patch_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name, patch)


def conflict(exc: BaseException) -> bool:
    """A conditional write another writer came before (409 Conflict)."""
    return isinstance(exc, ApiException) and exc.status == 409


# --- pods ---------------------------------------------------------------------------------------------


def delete_job(job: dict[str, Any]) -> None:
    """Delete a job and, through the garbage collector, its pods (a 404 is done already)."""
    kind = JOB_KINDS[job["kind"]]
    try:
        _custom().delete_namespaced_custom_object(kind.group, kind.version, job["metadata"]["namespace"], kind.plural,
                                                  job["metadata"]["name"], propagation_policy="Background")
    except ApiException as exc:
        if exc.status != 404:
            raise


def benchmark_events(namespace: str, uid: str | None) -> list[dict[str, Any]]:
    """The Events about the benchmark of `uid` (involvedObject.uid), as the API returns them."""
    response = request("GET", EVENTS, {"namespace": namespace}, {"fieldSelector": f"involvedObject.uid={uid}"})
    return json.loads(response.data).get("items", [])


# --- config maps (per-step records) -------------------------------------------------------------------


def save_configmap(config_map: dict[str, Any], owner_uid: str | None) -> bool:
    """Create a ConfigMap; an existing one of ours counts as saved (a retry), another owner's is left alone
    (False)."""
    namespace, name = config_map["metadata"]["namespace"], config_map["metadata"]["name"]
    try:
        request("POST", CONFIG_MAPS, {"namespace": namespace}, body=config_map)
    except ApiException as exc:
        if exc.status != 409:
            raise
        response = request("GET", CONFIG_MAPS + "/{name}", {"namespace": namespace, "name": name})
        return decide.controller_uid(json.loads(response.data)) == owner_uid
    return True
