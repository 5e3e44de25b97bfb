"""kmock's KubernetesEmulator with the gaps of kmock 0.8 filled (see ../shared/ENVIRONMENT.md).

Kept from kmock: the HTTP server, request parsing, API discovery, the object store
(`emulator.objects[...]` for assertions), watch buses and its reaction DSL (a test can still say
`emulator['create pytorchjobs'] << 500` to inject a failure: reactions win over the fallbacks here).

Added here, as a real API server does it:
- `resourceVersion` (one global counter), `uid`, `creationTimestamp`, `generation`, `generateName`;
- create answers 201, lists carry `kind`/`apiVersion`/`resourceVersion`, watch streams are
  `application/json` and resume from `?resourceVersion=` (410 Gone when too old), `timeoutSeconds`;
- PATCH by content type (JSON patch with `test`, merge patch; a patch that sets `metadata.resourceVersion` is
  conditional on it: 409 when stale), PUT with optimistic concurrency;
- label and field selectors on list and watch;
- the `/status` subresource: the main endpoint ignores `status`, `/status` changes only `status`;
- deletion with finalizers (`deletionTimestamp`, removed when the last finalizer goes) and
  background garbage collection of dependents by `ownerReferences[].uid`;
- CRDs: creating one registers its resource for discovery; custom resources are pruned or, with
  `fieldValidation=Strict`, rejected for unknown fields, and validated against `openAPIV3Schema`;
- every object's labels validated as ObjectMeta (422 naming the value, as the API server answers);
- `GET /api/v1/namespaces` (kmock's URL parser fails on it), `Table` output for `kubectl get`;
- pod logs (`pods/NAME/log`, `tailLines`, `limitBytes`, `previous`), from what the test double says a container printed;
- mutating admission: functions in `admission` may change an object before it is validated and stored
  (the test plays Kueue's webhook with one);
- fault injection (tests/kube/faults.py): functions in `faults` may answer a request with an error before
  anything is stored, answer it late, never (until released) or with a body that never ends, and functions in `watch_faults` may end a watch stream early or answer 410 Gone;
- orphaning deletion removes the owner's reference from its dependents, as the garbage collector does.
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import json
import pickle
import random
import re
import string
import time
import uuid
from typing import Any

import aiohttp.web
import attrs
import kmock

from . import semantics, tables
from .semantics import ApiError

BUILTINS = {
    "v1/namespaces": dict(kind="Namespace", singular="namespace", namespaced=False, subresources={"status"}),
    "v1/pods": dict(kind="Pod", singular="pod", namespaced=True, subresources={"status"}, shortnames={"po"}),
    "v1/events": dict(kind="Event", singular="event", namespaced=True, shortnames={"ev"}),
    "v1/configmaps": dict(kind="ConfigMap", singular="configmap", namespaced=True, shortnames={"cm"}),
    "coordination.k8s.io/v1/leases": dict(kind="Lease", singular="lease", namespaced=True),
    "networking.k8s.io/v1/networkpolicies": dict(kind="NetworkPolicy", singular="networkpolicy", namespaced=True,
                                                 shortnames={"netpol"}),
    "apiextensions.k8s.io/v1/customresourcedefinitions": dict(
        kind="CustomResourceDefinition", singular="customresourcedefinition", namespaced=False,
        subresources={"status"}, shortnames={"crd", "crds"},
    ),
}
VERBS = {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}


def clone(obj: Any) -> Any:
    """A copy of a stored object or request body: JSON data, which a pickle round trip copies exactly and about
    five times faster than copy.deepcopy (every list, watch event and write copies whole objects)."""
    return pickle.loads(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))


# The least OpenAPI v3 that makes kubectl validate on the server (`?fieldValidation=Strict`) instead of
# downloading schemas: kubectl looks for a PATCH operation with that query parameter; for CRDs it checks
# the CRD endpoint, and for custom resources the Namespace one (k8s.io/kubectl QueryParamVerifierV3).
def _patch_op(group: str, version: str, kind: str, path: str) -> dict:
    return {path: {"patch": {
        "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": kind},
        "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
        "responses": {},
    }}}


OPENAPI_V3 = {
    "apis/apiextensions.k8s.io/v1": _patch_op("apiextensions.k8s.io", "v1", "CustomResourceDefinition",
                                              "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"),
    "api/v1": _patch_op("", "v1", "Namespace", "/api/v1/namespaces/{name}"),
}
CUT = "_CUT"  # a bus message that ends the watch streams reading it (cut_watches), never sent to clients
ORPHAN_FINALIZER = "orphan"  # deletion with propagationPolicy Orphan, until the GC has orphaned the dependents
HISTORY_LIMIT = 20_000
_POD_LOG = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")  # watch events kept for resuming; older resourceVersions get 410 Gone


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _group_version(resource: kmock.resource) -> str:
    return f"{resource.group}/{resource.version}" if resource.group else resource.version


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    _rv: int = attrs.field(default=0, init=False)
    _crd_versions: dict[kmock.resource, dict] = attrs.field(factory=dict, init=False)
    _history: dict[kmock.resource, list[tuple[int, dict]]] = attrs.field(factory=dict, init=False)
    created_at: dict[tuple, float] = attrs.field(factory=dict, init=False)  # key → time.time(), for benchmarks
    # (namespace, pod, container) → what the container printed: served at pods/NAME/log
    pod_logs: dict[tuple[str, str, str], str] = attrs.field(factory=dict, init=False)
    # mutating admission: fn(resource, object) may change the object being created (e.g. Kueue's webhook)
    admission: list[Any] = attrs.field(factory=list, init=False)
    # (User-Agent, group, resource, verb) of the requests served past kmock (which records the others)
    outside_requests: list[tuple[str, str, str, str]] = attrs.field(factory=list, init=False)
    _builtin_reactions: int = attrs.field(default=0, init=False)
    # fn(request) -> ApiError | float | awaitable | kmock.Response | None: an error to answer instead (nothing
    # stored), seconds to wait before answering, something to await before answering (a request never answered
    # until it is done), or a response of the fault's own; see tests/kube/faults.py
    faults: list[Any] = attrs.field(factory=list, init=False)
    # fn(request) -> None | "gone" | seconds: a watch answered 410 Gone, or ended after that many seconds
    watch_faults: list[Any] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback[kmock.method.PUT] << self._serve_replace
        for key, info in BUILTINS.items():
            self.resources[key] = kmock.ResourceInfo(verbs=VERBS, **info)
        self._builtin_reactions = len(self._payloads)

    # --- entry points -----------------------------------------------------------------------------

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        path = raw.path.rstrip("/")
        if path in ("/api", "/apis") and raw.path != path:  # the Python client asks for `/apis/`
            raw = raw.clone(rel_url=raw.rel_url.with_path(path))
        if path == "/api/v1/namespaces":  # kmock's path parser raises on this one
            return await self._serve_namespaces(raw)
        if path == "/openapi/v3":
            return aiohttp.web.json_response({"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}"} for gv in OPENAPI_V3}})
        if path.removeprefix("/openapi/v3/") in OPENAPI_V3:
            return aiohttp.web.json_response({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.26.4"},
                                              "paths": OPENAPI_V3[path.removeprefix("/openapi/v3/")]})
        if path.startswith("/openapi/"):
            return aiohttp.web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        log = _POD_LOG.match(path)
        if log and raw.method == "GET":  # text, not JSON: served here, past kmock's (sticky) response headers
            self.outside_requests.append((raw.headers.get("User-Agent", ""), "", "pods/log", "get"))
            try:
                text = await self._pod_log(*log.groups(), raw.query)
            except ApiError as exc:
                return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                                  "code": exc.code, "reason": exc.reason, "message": exc.message},
                                                 status=exc.code)
            return aiohttp.web.Response(body=text, content_type="text/plain")
        if raw.path != path and path in ("/api", "/apis"):  # the client asks for `/apis/`; kmock knows `/apis`
            raw = raw.clone(rel_url=raw.rel_url.with_path(path))
        return await super().__call__(raw)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # Skip KubernetesEmulator._handle: it mutates the store before any reaction is chosen. Here the
        # fallbacks below mutate it, so a test's injected error (a reaction) leaves the store untouched.
        try:
            for fault in self.faults:
                outcome = fault(request)
                if isinstance(outcome, float):  # a slow answer: this many seconds, other requests go on
                    await asyncio.sleep(outcome)
                elif inspect.isawaitable(outcome):  # no answer until it is done (the connection stays open)
                    await outcome
                elif isinstance(outcome, kmock.Response):  # an answer of the fault's own (e.g. one that never ends)
                    return await outcome(request)
                elif outcome is not None:
                    raise outcome
            serve = self._direct(request)
            if serve is None:
                return await kmock.RawHandler._handle(self, request)
            return await kmock.Response(payload=await serve(request))(request)
        except ApiError as exc:
            return aiohttp.web.json_response(
                {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                 "code": exc.code, "reason": exc.reason, "message": exc.message},
                status=exc.code, headers=exc.headers,
            )

    def _direct(self, request: kmock.Request) -> Any:
        """The fallback for this request when no test reaction is set, else None (kmock dispatches).

        kmock matches a request against every reaction by scanning the requests each one has seen,
        which costs O(requests so far) per request: ~40 ms after a few thousand. Benchmarks and long
        tests would measure that, so without reactions of a test's own, dispatch here directly.
        """
        if len(self._payloads) != self._builtin_reactions or request.resource is None:
            return None
        if request.resource.plural is None:
            return None  # discovery: few requests, kmock serves them
        if request.method == kmock.method.PUT:
            return self._serve_replace
        return {
            kmock.action.LIST: self._serve_list, kmock.action.WATCH: self._serve_watch,
            kmock.action.FETCH: self._serve_fetch, kmock.action.CREATE: self._serve_create,
            kmock.action.UPDATE: self._serve_update, kmock.action.DELETE: self._serve_delete,
        }.get(request.action)

    @property
    def watch_history(self) -> dict[kmock.resource, list[tuple[int, dict]]]:
        """(resourceVersion, event) per resource, as watchers got them: for assertions."""
        return self._history

    # --- helpers ------------------------------------------------------------------------------------

    def _info(self, resource: kmock.resource | None) -> kmock.ResourceInfo:
        if resource is None or resource not in self.resources:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource {resource}")
        return self.resources[resource]

    def _key(self, request: kmock.Request, name: str | None = None) -> tuple:
        info = self._info(request.resource)
        return (request.resource, request.namespace if info.namespaced else None, name or request.name)

    def _current(self, key: tuple) -> dict:
        if key not in self.objects or self.objects[key].deleted:
            raise ApiError(404, "NotFound", f'{key[0].plural} "{key[2]}" not found')
        return clone(self.objects[key].raw)

    async def _emit(self, resource: kmock.resource, kind: str, obj: dict) -> None:
        event = {"type": kind, "object": clone(obj)}
        history = self._history.setdefault(resource, [])
        history.append((self._rv, event))
        del history[:-HISTORY_LIMIT]
        await self._buses[resource].put(event)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _check_schema(self, request: kmock.Request, obj: dict) -> dict:
        version = self._crd_versions.get(request.resource)
        if version is None:
            return obj
        strict = request.params.get("fieldValidation") == "Strict"
        return semantics.validate_custom_resource(obj, version, strict=strict)

    def _store(self, key: tuple, obj: dict) -> None:
        if key in self.objects and not self.objects[key].deleted:
            self.objects[key].create(obj)  # appends a version to kmock's history
            del self.objects[key].history[:-5]  # bounded memory for long benchmarks
        else:
            self.objects[key] = obj

    # --- create, patch, put, delete -----------------------------------------------------------------

    async def _serve_create(self, request: kmock.Request) -> kmock.Response:
        info = self._info(request.resource)
        obj = request.data if isinstance(request.data, dict) else None
        if obj is None:
            raise ApiError(415, "UnsupportedMediaType", "only JSON bodies are understood (no protobuf)")
        obj = clone(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        if not meta.get("name"):
            raise ApiError(422, "Invalid", "metadata.name: Required value: name or generateName is required")
        if info.namespaced:
            if meta.get("namespace") not in (None, request.namespace):
                raise ApiError(400, "BadRequest", "the namespace of the object does not match the request")
            meta["namespace"] = request.namespace
        async with self._lock:
            key = self._key(request, meta["name"])
            if key in self.objects and not self.objects[key].deleted:
                raise ApiError(409, "AlreadyExists", f'{request.resource.plural} "{meta["name"]}" already exists')
            obj.setdefault("apiVersion", _group_version(request.resource))
            obj.setdefault("kind", info.kind)
            if "status" in info.subresources:
                obj.pop("status", None)  # status comes only through /status
            for mutate in self.admission:
                mutate(request.resource, obj)
            semantics.validate_metadata(obj)
            obj = self._check_schema(request, obj)
            meta = obj["metadata"]
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1, resourceVersion=self._next_rv())
            for dropped in ("deletionTimestamp", "selfLink"):
                meta.pop(dropped, None)
            self._store(key, obj)
            self.created_at[key] = time.time()
            await self._emit(request.resource, "ADDED", obj)
            if request.resource == kmock.resource("apiextensions.k8s.io/v1/customresourcedefinitions"):
                self._register_crd(obj)
        return kmock.Response(status=201, payload=obj)

    async def _serve_update(self, request: kmock.Request) -> dict:
        content_type = request.headers.get("Content-Type", "application/merge-patch+json")
        async with self._lock:
            key = self._key(request)
            old = self._current(key)
            new = semantics.apply_patch(old, request.data, content_type)
            # A patch that sets metadata.resourceVersion is conditional on it (the API server compares the patched
            # object's resourceVersion with the stored one): a stale one is a lost race, 409 Conflict.
            sent_rv = (new.get("metadata") or {}).get("resourceVersion")
            if sent_rv != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {request.resource.plural} '
                               f'"{key[2]}": the object has been modified; please apply your changes to the latest '
                               f'version and try again')
            return await self._write(request, key, old, new)

    async def _serve_replace(self, request: kmock.Request) -> dict:
        if request.name is None or not isinstance(request.data, dict):
            raise ApiError(405, "MethodNotAllowed", "PUT needs an object name and a JSON body")
        async with self._lock:
            key = self._key(request)
            old = self._current(key)
            sent_rv = (request.data.get("metadata") or {}).get("resourceVersion")
            if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", "the object has been modified; please apply your changes "
                               "to the latest version and try again")
            return await self._write(request, key, old, clone(request.data))

    async def _write(self, request: kmock.Request, key: tuple, old: dict, new: dict) -> dict:
        info = self._info(request.resource)
        if request.subresource == "status":
            new = {**old, "status": new.get("status")} if new.get("status") is not None else \
                {k: v for k, v in old.items() if k != "status"}
        elif request.subresource is not None:
            raise ApiError(405, "MethodNotAllowed", f"subresource {request.subresource!r} is not writable here")
        elif "status" in info.subresources:
            new = {k: v for k, v in new.items() if k != "status"}
            if "status" in old:
                new["status"] = old["status"]
        meta = new.setdefault("metadata", {})
        for fixed in ("name", "namespace", "uid", "creationTimestamp", "generation", "resourceVersion"):
            if fixed in old["metadata"]:
                meta[fixed] = old["metadata"][fixed]
        if old["metadata"].get("deletionTimestamp"):
            meta["deletionTimestamp"] = old["metadata"]["deletionTimestamp"]
        if new == old:
            return old  # a no-op write changes nothing and wakes no watcher, as in a real API server
        semantics.validate_metadata(new)
        new = self._check_schema(request, new)
        strip = ("metadata", "status")
        if {k: v for k, v in new.items() if k not in strip} != {k: v for k, v in old.items() if k not in strip}:
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._store(key, new)
        await self._emit(request.resource, "MODIFIED", new)
        finalizers = new["metadata"].get("finalizers") or []
        if new["metadata"].get("deletionTimestamp") and finalizers in ([], [ORPHAN_FINALIZER]):
            await self._remove(key, orphan=finalizers == [ORPHAN_FINALIZER])
        return new

    async def _serve_delete(self, request: kmock.Request) -> dict:
        orphan = isinstance(request.data, dict) and request.data.get("propagationPolicy") == "Orphan"
        async with self._lock:
            key = self._key(request)
            return await self._delete(key, orphan=orphan)

    async def _delete(self, key: tuple, orphan: bool = False) -> dict:
        obj = self._current(key)
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                if orphan:  # the API server records the policy as the garbage collector's `orphan` finalizer
                    obj["metadata"]["finalizers"] = [*obj["metadata"]["finalizers"], ORPHAN_FINALIZER]
                obj["metadata"].update(deletionTimestamp=_now(), deletionGracePeriodSeconds=0,
                                       resourceVersion=self._next_rv())
                self._store(key, obj)
                await self._emit(key[0], "MODIFIED", obj)
            return obj
        return await self._remove(key, orphan=orphan)

    async def _remove(self, key: tuple, orphan: bool = False) -> dict:
        obj = self._current(key)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self.objects[key].delete()
        await self._emit(key[0], "DELETED", obj)
        uid = obj["metadata"].get("uid")
        for other_key, other in list(self.objects.items()):
            if other.deleted:
                continue
            refs = other.raw.get("metadata", {}).get("ownerReferences") or []
            if not any(ref.get("uid") == uid for ref in refs):
                continue
            if not orphan:  # background garbage collection of dependents
                await self._delete(other_key)
            else:  # orphaned: the dependent stays, without its reference to the owner
                kept = clone(other.raw)
                kept["metadata"]["ownerReferences"] = [ref for ref in refs if ref.get("uid") != uid]
                if not kept["metadata"]["ownerReferences"]:
                    del kept["metadata"]["ownerReferences"]
                kept["metadata"]["resourceVersion"] = self._next_rv()
                self._store(other_key, kept)
                await self._emit(other_key[0], "MODIFIED", kept)
        return obj

    # --- reads --------------------------------------------------------------------------------------

    def _select(self, request: kmock.Request, obj: dict) -> bool:
        meta = obj.get("metadata", {})
        return (
            (request.namespace is None or meta.get("namespace") == request.namespace)
            and (request.name is None or meta.get("name") == request.name)
            and semantics.matches_labels(meta.get("labels") or {}, request.params.get("labelSelector"))
            and semantics.matches_fields(obj, request.params.get("fieldSelector"))
        )

    def _items(self, request: kmock.Request) -> list[dict]:
        return [
            clone(obj.raw)
            for (resource, _, _), obj in self.objects.items()
            if resource == request.resource and not obj.deleted and self._select(request, obj.raw)
        ]

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        async with self._lock:
            obj = self._current(self._key(request))
        if request.subresource not in (None, "status"):
            raise ApiError(404, "NotFound", f"subresource {request.subresource!r} is not served")
        return tables.maybe_table(request, [obj], self._crd_versions.get(request.resource), single=True)

    async def _pod_log(self, namespace: str, name: str, query: Any) -> bytes:
        """A container's log as the kubelet serves it: the last `tailLines` lines, then at most `limitBytes`."""
        key = (kmock.resource("v1/pods"), namespace, name)
        async with self._lock:
            pod = self._current(key)
        containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        container = query.get("container") or (containers[0] if len(containers) == 1 else None)
        if container not in containers:
            raise ApiError(400, "BadRequest", f"a container name must be specified for pod {name}, "
                                              f"choose one of: {containers}")
        previous = query.get("previous") == "true"  # the container before its last restart (kept by the kubelet)
        text = self.pod_logs.get((namespace, name, container, "previous") if previous else (namespace, name, container),
                                 "")
        if query.get("tailLines"):
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(query["tailLines"]):]) if int(query["tailLines"]) else ""
        data = text.encode()
        return data[: int(query["limitBytes"])] if query.get("limitBytes") else data

    async def _serve_list(self, request: kmock.Request) -> Any:
        info = self._info(request.resource)
        async with self._lock:
            items = sorted(self._items(request), key=lambda o: (o["metadata"].get("namespace") or "",
                                                                o["metadata"]["name"]))
            rv = str(self._rv)
        table = tables.maybe_table(request, items, self._crd_versions.get(request.resource), single=False)
        if table is not items:
            return table
        return {"apiVersion": _group_version(request.resource), "kind": f"{info.kind}List",
                "metadata": {"resourceVersion": rv}, "items": items}

    async def _serve_watch(self, request: kmock.Request) -> kmock.Response:
        self._info(request.resource)
        since = request.params.get("resourceVersion")
        timeout = float(request.params.get("timeoutSeconds") or 0) or None
        faults = [f for f in (fault(request) for fault in self.watch_faults) if f is not None]
        gone = "gone" in faults
        drops = [f for f in faults if f != "gone"]
        if drops:  # the connection is cut that early (the client sees a stream end, then resumes)
            timeout = min(timeout or float("inf"), *drops)
        bus = self._buses[request.resource]
        async with self._lock:
            mark = await bus.mark()
            history = self._history.get(request.resource, [])
            if since in (None, "", "0"):
                backlog = [{"type": "ADDED", "object": obj} for obj in self._items(request)]
            elif gone or history and int(since) < history[0][0] - 1 and len(history) >= HISTORY_LIMIT:
                backlog = [{"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "code": 410,
                                                         "reason": "Expired", "message": "too old resource version"}}]
            else:
                backlog = [event for rv, event in history if rv > int(since)]

        async def stream():
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout if timeout else None
            try:
                yield b""  # send the headers now, even if nothing happens for a while
                for event in backlog:
                    if event["type"] == "ERROR":
                        yield event
                        return  # as the API server: the stream ends after its error
                    if self._select(request, event["object"]):
                        yield event
                events = bus.stream(since=mark)
                while True:
                    remaining = None if deadline is None else deadline - loop.time()
                    if remaining is not None and remaining <= 0:
                        return
                    try:
                        event = await asyncio.wait_for(anext(events), remaining)
                    except TimeoutError:
                        return
                    if event["type"] == CUT:
                        return
                    if self._select(request, event["object"]):
                        yield event
            finally:
                await bus.unmark(mark)

        return kmock.Response(headers={"Content-Type": "application/json"}, payload=stream())

    async def cut_watches(self) -> None:
        """End every open watch stream now, as a restarting API server or a load balancer would; clients
        resume from their last resourceVersion (tests/kube/faults.py)."""
        for bus in list(self._buses.values()):
            await bus.put({"type": CUT, "object": {}})

    async def _serve_namespaces(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        names = {"default"} | {ns for (_, ns, _) in self.objects if ns}
        items = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}, "status": {"phase": "Active"}}
                 for n in sorted(names)]
        if raw.query.get("watch") != "true":
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "NamespaceList",
                                              "metadata": {"resourceVersion": str(self._rv)}, "items": items})
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        if raw.query.get("resourceVersion") in (None, "", "0"):
            for item in items:
                await response.write(json.dumps({"type": "ADDED", "object": item}).encode() + b"\n")
        await asyncio.sleep(float(raw.query.get("timeoutSeconds") or 3600))  # namespaces never change here
        return response

    async def _serve_version(self, request: kmock.Request) -> Any:
        # kmock lists `x/status` with the parent's short names; kubectl then warns about ambiguity
        document = await super()._serve_version(request)
        document["groupVersion"] = document["groupVersion"].lstrip("/")  # kmock says "/v1" for the core group
        for entry in document.get("resources", []):
            if "/" in entry["name"]:
                entry.update(shortNames=[], categories=[], singularName="", verbs=["get", "patch", "update"])
        return document

    # --- CRDs ---------------------------------------------------------------------------------------

    def _register_crd(self, crd: dict) -> None:
        spec = crd["spec"]
        names = spec["names"]
        for version in spec.get("versions", []):
            if not version.get("served", True):
                continue
            resource = kmock.resource(spec["group"], version["name"], names["plural"])
            self.resources[resource] = kmock.ResourceInfo(
                kind=names["kind"], singular=names.get("singular") or names["kind"].lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced", verbs=VERBS,
                shortnames=set(names.get("shortNames") or []), categories=set(names.get("categories") or []),
                subresources={s for s in (version.get("subresources") or {}) if s == "status"},
            )
            self._crd_versions[resource] = version

