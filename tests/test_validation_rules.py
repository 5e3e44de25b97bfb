"""Every validation rule has a case, and the CRD and the local validation agree on it.

SHARED: rules the CRD states (OpenAPI schema, list types, CEL `x-kubernetes-validations`): each case is
refused by `load_benchmark` (naming the field) and by the CRD as the emulated API server applies it
(tests/kube/semantics.py: null pruning, schema, list types, CEL with cel-python); a sample goes through
a real `kubectl apply` against the emulator. LOCAL_ONLY: rules the CRD cannot state; the CRD accepts
them (asserted, so that a rule moved into the CRD moves to SHARED) and the operator refuses them.
File-level rules (bytes, YAML) are in tests/test_documents.py, the sweep bound in test_sweep_bound.py.
"""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from kube.semantics import ApiError, validate_custom_resource
from kubeflow_crds import strict

from gpt2bench.specification import crd
from gpt2bench.specification.model import MAX_RUNS, PRECISIONS, STRATEGIES
from gpt2bench.specification.validation import SpecError, load_benchmark

BASE = {"sweep": {"strategies": [{"name": "ddp"}]}}
VERSION = crd.build_crd()["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]


def document(spec: dict, name: str = "rule") -> dict:
    return {"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": name},
            "spec": spec}


def with_(**sections) -> dict:
    """BASE with top-level spec sections replaced (`training={...}`)."""
    return {**copy.deepcopy(BASE), **sections}


def sweep(**fields) -> dict:
    return {"sweep": {**copy.deepcopy(BASE["sweep"]), **fields}}


# (id, spec, the field the local error names, what the API server's message says)
SHARED = [
    # --- OpenAPI schema: fields, types, bounds, patterns
    ("unknown-field", with_(replicas=3), "spec.replicas", 'unknown field "spec.replicas"'),
    ("snake-case-field", with_(training={"micro_batch_size": 4}), "spec.training.micro_batch_size",
     "unknown field"),
    ("bool-as-integer", with_(training={"steps": True}), "spec.training.steps", "is not of type 'integer'"),
    ("string-as-number", with_(training={"lr": "0.1"}), "spec.training.lr", "is not of type 'number'"),
    ("string-as-boolean", with_(scheduling={"gang": "yes"}), "spec.scheduling.gang", "is not of type 'boolean'"),
    ("number-as-string", with_(image=5), "spec.image", "is not of type 'string'"),
    ("integer-beyond-int64", with_(training={"seed": 2**64}), "spec.training.seed", "is greater than the maximum"),
    ("seed-beyond-trainer", with_(training={"seed": 2**32}), "spec.training.seed", "is greater than the maximum"),
    ("number-not-finite", with_(training={"maxGradNorm": float("inf")}), "spec.training.maxGradNorm",
     "is greater than the maximum"),
    ("enum", with_(model={"preset": "gpt3"}), "spec.model.preset", "is not one of"),
    ("required", {"model": {"preset": "tiny"}}, "spec.sweep", "'sweep' is a required property"),
    ("minimum", sweep(scales=[{"nodes": 0}]), "spec.sweep.scales[0].nodes", "is less than the minimum"),
    ("maximum", with_(concurrency=65), "spec.concurrency", "is greater than the maximum"),
    ("min-items", {"sweep": {"strategies": []}}, "spec.sweep.strategies", "should be non-empty"),
    ("max-items", sweep(scales=[{"nodes": 1}] * (MAX_RUNS + 1)), "spec.sweep.scales", "is too long"),
    ("privileged-port", with_(metrics={"port": 80}), "spec.metrics.port", "is less than the minimum"),
    ("empty-pretrained", with_(model={"pretrained": ""}), "spec.model.pretrained", "should be non-empty"),
    ("quantity-grammar", with_(resources={"requests": {"memory": "lots"}}), "spec.resources.requests.memory",
     "does not match"),
    ("quantity-negative-string", with_(resources={"limits": {"cpu": "-1"}}), "spec.resources.limits.cpu",
     "does not match"),
    ("quantity-not-int-or-string", with_(resources={"requests": {"cpu": 0.5}}), "spec.resources.requests.cpu",
     "is not valid under any of the given schemas"),
    ("label-value-syntax", with_(nodeSelector={"zone": "eu west"}), "spec.nodeSelector.zone", "does not match"),
    ("label-value-length", with_(metrics={"podLabels": {"team": "x" * 64}}), "spec.metrics.podLabels.team",
     "is too long"),
    ("kueue-queue-label-value", with_(scheduling={"kueueQueue": "team queue"}), "spec.scheduling.kueueQueue",
     "does not match"),
    ("priority-class-dns-name", with_(scheduling={"priorityClassName": "Fast_Lane"}),
     "spec.scheduling.priorityClassName", "does not match"),
    # Go's `$` ends the text; Python's `re.match` with `$` lets one final newline through.
    ("priority-class-final-newline", with_(scheduling={"priorityClassName": "fast\n"}),
     "spec.scheduling.priorityClassName", "does not match"),
    ("label-value-final-newline", with_(metrics={"podLabels": {"team": "a\n"}}), "spec.metrics.podLabels.team",
     "does not match"),
    ("image-whitespace", with_(image="repo/image:1 "), "spec.image", "does not match"),
    ("toleration-value-label-value", with_(tolerations=[{"key": "gpu", "value": "a b"}]), "spec.tolerations[0].value",
     "does not match"),
    ("toleration-key-length", with_(tolerations=[{"key": "k" * 400, "operator": "Exists"}]),
     "spec.tolerations[0].key", "is too long"),
    # --- list types: what must be unique
    ("strategy-listed-twice", sweep(strategies=[{"name": "ddp"}, {"name": "ddp"}]), "spec.sweep.strategies[1].name",
     'spec.sweep.strategies[1]: Duplicate value: {"name": "ddp"}'),
    ("precision-listed-twice", sweep(precisions=["fp32", "bf16", "fp32"]), "spec.sweep.precisions[2]",
     'spec.sweep.precisions[2]: Duplicate value: "fp32"'),
    # --- CEL rules (x-kubernetes-validations)
    ("scale-listed-twice", sweep(scales=[{"nodes": 1}, {"nodes": 2}, {"nodes": 1}]), "spec.sweep.scales[2]",
     "scales must differ in nodes, devicesPerNode or processesPerNode"),
    ("scale-listed-twice-with-defaults",
     sweep(scales=[{"devicesPerNode": 2}, {"devicesPerNode": 2, "processesPerNode": 2, "nodes": 1}]),
     "spec.sweep.scales[1]", "scales must differ"),  # as the runs see them: defaults filled in
    ("ttl-shorter-than-the-operator-may-need", with_(runPolicy={"ttlSecondsAfterFinished": 5}),
     "spec.runPolicy.ttlSecondsAfterFinished", "ttlSecondsAfterFinished must be at least 60"),
    ("warmup-not-below-steps", with_(training={"steps": 10, "warmupSteps": 10}), "spec.training.warmupSteps",
     "warmupSteps must be less than steps"),
    ("warmup-default-not-below-steps", with_(training={"steps": 3}), "spec.training.warmupSteps",
     "warmupSteps must be less than steps"),  # the default warm-up (5) counts, given or not
    ("custom-preset-without-sizes", with_(model={"preset": "custom", "nHead": 4, "nEmbd": 64}), "spec.model.nLayer",
     "preset custom needs nLayer, nHead and nEmbd"),
    ("heads-do-not-divide-given-hidden", with_(model={"nEmbd": 100, "nHead": 3}), "spec.model.nEmbd",
     "nHead must divide nEmbd"),
    ("heads-do-not-divide-preset-hidden", with_(model={"preset": "gpt2", "nHead": 5}), "spec.model.nHead",
     "nHead must divide nEmbd"),
    ("preset-heads-do-not-divide-hidden", with_(model={"nEmbd": 129}), "spec.model.nEmbd",
     "nHead must divide nEmbd"),  # tiny's 2 heads
    ("max-repeats-not-above-repeats", sweep(repeats=3, maxRepeats=3), "spec.sweep.maxRepeats",
     "maxRepeats must be more than repeats"),
    ("max-repeats-not-above-default-repeats", sweep(maxRepeats=1), "spec.sweep.maxRepeats",
     "is less than the minimum"),
    ("budget-without-max-repeats", sweep(budget={"wallSeconds": 60}), "spec.sweep.budget",
     "budget needs maxRepeats"),
    ("budget-without-a-limit", sweep(maxRepeats=4, budget={}), "spec.sweep.budget.wallSeconds",
     "set wallSeconds and/or gpuHours"),
    ("min-effect-not-a-share", sweep(minEffect=1.0), "spec.sweep.minEffect", "is greater than or equal to the maximum"),
    ("ddp-option-on-fsdp", sweep(strategies=[{"name": "fsdp", "bucketCapMb": 25}]),
     "spec.sweep.strategies[0].bucketCapMb", "bucketCapMb applies to ddp only"),
    ("fsdp-option-on-ddp", sweep(strategies=[{"name": "ddp", "reshardAfterForward": False}]),
     "spec.sweep.strategies[0].reshardAfterForward", "reshardAfterForward applies to fsdp only"),
    ("ddp-static-graph-on-ps", sweep(strategies=[{"name": "ps", "staticGraph": True}]),
     "spec.sweep.strategies[0].staticGraph", "staticGraph applies to ddp only"),
    ("ddp-bucket-view-on-horovod", sweep(strategies=[{"name": "horovod", "gradientAsBucketView": True}]),
     "spec.sweep.strategies[0].gradientAsBucketView", "gradientAsBucketView applies to ddp only"),
    ("ps-mode-on-ddp", sweep(strategies=[{"name": "ddp", "psMode": "async"}]), "spec.sweep.strategies[0].psMode",
     "psMode applies to ps/ps-sharded only"),
    ("ps-servers-on-fsdp", sweep(strategies=[{"name": "fsdp", "psServers": 2}]), "spec.sweep.strategies[0].psServers",
     "psServers applies to ps/ps-sharded only"),
    ("ps-server-device-on-horovod", sweep(strategies=[{"name": "horovod", "psServerDevice": "cpu"}]),
     "spec.sweep.strategies[0].psServerDevice", "psServerDevice applies to ps/ps-sharded only"),
    ("ps-sharded-one-server", sweep(strategies=[{"name": "ps-sharded", "psServers": 1}]),
     "spec.sweep.strategies[0].psServers", "ps-sharded needs at least 2 servers"),
    ("processes-differ-from-gpus", sweep(scales=[{"devicesPerNode": 4, "processesPerNode": 2}]),
     "spec.sweep.scales[0].processesPerNode", "processesPerNode must equal devicesPerNode"),
    ("dataparallel-on-two-nodes", sweep(strategies=[{"name": "ddp"}, {"name": "dataparallel"}],
                                        scales=[{"nodes": 1}, {"nodes": 2}]),
     "spec.sweep.scales[1].nodes", "dataparallel runs in one process on one node"),
    ("ps-servers-not-spread-evenly", sweep(strategies=[{"name": "ps", "psServers": 3}], scales=[{"nodes": 2}]),
     "spec.sweep.strategies[0].psServers", "psServers must be a multiple of every scale's nodes"),
    ("ps-default-servers-not-spread", sweep(strategies=[{"name": "ps"}], scales=[{"nodes": 2}]),
     "spec.sweep.strategies[0].psServers", "psServers must be a multiple of every scale's nodes"),
    ("too-many-runs", sweep(strategies=[{"name": s} for s in STRATEGIES], precisions=list(PRECISIONS),
                            scales=[{"processesPerNode": n} for n in range(1, 14)]),
     "spec.sweep", f"must be at most {MAX_RUNS} runs"),
    ("seq-len-beyond-positions", with_(model={"nPositions": 64}, training={"seqLen": 128}), "spec.training.seqLen",
     "training.seqLen must not exceed model.nPositions"),
    ("default-seq-len-beyond-positions", with_(model={"nPositions": 64}), "spec.training.seqLen",
     "training.seqLen must not exceed model.nPositions"),  # the default seqLen (128) counts
    ("toleration-exists-with-value", with_(tolerations=[{"key": "gpu", "operator": "Exists", "value": "x"}]),
     "spec.tolerations[0].value", "value must be empty when operator is Exists"),
    ("toleration-without-key-not-exists", with_(tolerations=[{"operator": "Equal", "value": "x"}]),
     "spec.tolerations[0].operator", "operator must be Exists when key is empty"),
    ("toleration-seconds-without-no-execute", with_(tolerations=[{"key": "gpu", "effect": "NoSchedule",
                                                                  "tolerationSeconds": 30}]),
     "spec.tolerations[0].tolerationSeconds", "tolerationSeconds needs effect NoExecute"),
    ("quantity-negative-integer", with_(resources={"requests": {"cpu": -1}}), "spec.resources.requests.cpu",
     "must not be negative"),
    ("digest-syntax", with_(image="reg.example/t", imageDigest="sha256:abc"), "spec.imageDigest",
     "does not match"),
    ("image-digest-without-image", with_(imageDigest="sha256:" + "0" * 64), "spec.imageDigest",
     "imageDigest needs image"),
    ("cpu-digest-without-cpu", with_(images={"gpu": "reg.example/t", "cpuDigest": "sha256:" + "0" * 64}),
     "spec.images.cpuDigest", "cpuDigest needs cpu"),
    ("gpu-digest-without-gpu", with_(images={"gpuDigest": "sha256:" + "0" * 64}), "spec.images.gpuDigest",
     "gpuDigest needs gpu"),
    ("metrics-namespace-syntax", with_(networkPolicy={"metricsNamespaces": ["Monitoring"]}),
     "spec.networkPolicy.metricsNamespaces[0]", "does not match"),
    # --- the pods' plumbing (spec.pods, spec.affinity, spec.jobMetadata) and what a TrainJob cannot carry
    ("env-name-syntax", with_(pods={"env": [{"name": "1X", "value": "a"}]}), "spec.pods.env[0].name",
     "does not match"),
    ("env-value-and-value-from", with_(pods={"env": [{"name": "A", "value": "a", "valueFrom": {
        "secretKeyRef": {"name": "s", "key": "k"}}}]}), "spec.pods.env[0].valueFrom", "set value or valueFrom"),
    ("env-source-none", with_(pods={"env": [{"name": "A", "valueFrom": {}}]}),
     "spec.pods.env[0].valueFrom.secretKeyRef", "set exactly one of secretKeyRef and configMapKeyRef"),
    ("env-listed-twice", with_(pods={"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}),
     "spec.pods.env[1].name", "env: each variable once"),
    ("env-of-a-sidecar-fabric", with_(pods={"env": [{"name": "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY",
                                                      "value": "/dev/aperture_devices"}]}),
     "spec.pods.env[0].name", "needs Google's RxDM daemon as a second container"),
    ("gpudirect-without-a-check", with_(fabric={"require": "none", "gpuDirectRdma": True}),
     "spec.fabric.gpuDirectRdma", "gpuDirectRdma needs require auto or rdma"),
    ("fabric-require-enum", with_(fabric={"require": "ib"}), "spec.fabric.require", "is not one of"),
    ("nccl-env-script-relative", with_(fabric={"ncclEnvScript": "set_nccl_env.sh"}), "spec.fabric.ncclEnvScript",
     "does not match"),
    ("secret-key-syntax", with_(pods={"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s",
                                                                                          "key": "a/b"}}}]}),
     "spec.pods.env[0].valueFrom.secretKeyRef.key", "does not match"),
    ("volume-without-source", with_(pods={"volumes": [{"name": "v", "mountPath": "/v"}]}), "spec.pods.volumes[0]",
     "set exactly one source"),
    ("volume-two-sources", with_(pods={"volumes": [{"name": "v", "mountPath": "/v", "emptyDir": {},
                                                    "configMap": {"name": "c"}}]}), "spec.pods.volumes[0]",
     "set exactly one source"),
    ("volume-relative-path", with_(pods={"volumes": [{"name": "v", "mountPath": "data", "emptyDir": {}}]}),
     "spec.pods.volumes[0].mountPath", "does not match"),
    ("volume-name-syntax", with_(pods={"volumes": [{"name": "Data", "mountPath": "/d", "emptyDir": {}}]}),
     "spec.pods.volumes[0].name", "does not match"),
    ("volume-path-twice", with_(pods={"volumes": [{"name": "a", "mountPath": "/d", "emptyDir": {}},
                                                  {"name": "b", "mountPath": "/d", "emptyDir": {}}]}),
     "spec.pods.volumes[1].mountPath", "volumes: each mountPath once"),
    ("volume-name-twice", with_(pods={"volumes": [{"name": "a", "mountPath": "/d", "emptyDir": {}},
                                                  {"name": "a", "mountPath": "/e", "emptyDir": {}}]}),
     "spec.pods.volumes[1].name", "volumes: each name once"),
    ("capability-syntax", with_(pods={"capabilities": ["ipc_lock"]}), "spec.pods.capabilities[0]", "does not match"),
    ("run-as-root", with_(pods={"runAsUser": 0}), "spec.pods.runAsUser", "is less than the minimum"),
    ("affinity-in-without-values", with_(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In"}]}]}}}),
     "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0].values", "values: none for Exists/DoesNotExist"),
    ("affinity-exists-with-values", with_(affinity={"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
         "topologyKey": "kubernetes.io/hostname"}]}}),
     "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector"
     ".matchExpressions[0].values", "values: none for Exists/DoesNotExist"),
    ("trainjob-host-network", with_(backend="trainjob", pods={"hostNetwork": True}), "spec.pods.hostNetwork",
     "a TrainJob cannot put its pods on the host network"),
    ("trainjob-priority-class", with_(backend="trainjob", scheduling={"priorityClassName": "high"}),
     "spec.scheduling.priorityClassName", "a TrainJob cannot set its pods' priorityClassName"),
    ("host-network-concurrency", with_(pods={"hostNetwork": True}, concurrency=2), "spec.concurrency",
     "pods.hostNetwork needs concurrency 1"),
    ("resource-claim-without-source", with_(pods={"resourceClaims": [{"name": "efa"}]}),
     "spec.pods.resourceClaims[0].resourceClaimTemplateName",
     "set exactly one of resourceClaimTemplateName and resourceClaimName"),
    ("resource-claim-twice", with_(pods={"resourceClaims": [{"name": "efa", "resourceClaimName": "a"},
                                                            {"name": "efa", "resourceClaimName": "b"}]}),
     "spec.pods.resourceClaims[1].name", "resourceClaims: each name once"),
    ("timeout-zero", with_(training={"timeoutSeconds": 0}), "spec.training.timeoutSeconds",
     "is less than the minimum"),
]

# (id, spec, the field the local error names, why the CRD cannot state it)
LOCAL_ONLY = [
    ("resource-name", with_(resources={"requests": {"gpus": 1}}), "spec.resources.requests.gpus",
     "map keys have no pattern in OpenAPI (and CEL over unbounded keys is too costly)"),
    ("limit-below-request", with_(resources={"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}),
     "spec.resources.limits.memory", "comparing quantities needs Kubernetes' CEL quantity library"),
    ("extended-resource-fraction", with_(resources={"limits": {"example.com/fpga": "500m"}}),
     "spec.resources.limits[example.com/fpga]", "needs quantities parsed"),
    ("extended-resource-without-limit", with_(resources={"requests": {"example.com/fpga": 1}}),
     "spec.resources.limits[example.com/fpga]", "a rule over map keys"),
    ("extended-resource-request-differs", with_(resources={"requests": {"example.com/fpga": 1},
                                                           "limits": {"example.com/fpga": 2}}),
     "spec.resources.limits[example.com/fpga]", "needs quantities parsed"),
    ("node-selector-key", with_(nodeSelector={"gpu/": "a100"}), "spec.nodeSelector[gpu/]", "map keys"),
    ("pod-label-key", with_(metrics={"podLabels": {"-team": "a"}}), "spec.metrics.podLabels[-team]", "map keys"),
    ("pod-annotation-key", with_(metrics={"podAnnotations": {"a b": "c"}}), "spec.metrics.podAnnotations['a b']",
     "map keys"),
    ("toleration-key-syntax", with_(tolerations=[{"key": "gpu type", "operator": "Exists"}]),
     "spec.tolerations[0].key", "a qualified name's prefix length has no single-pattern form"),
    ("metrics-ports-past-65535", with_(metrics={"port": 65535}, sweep={"strategies": [{"name": "ddp"}],
                                                                       "scales": [{"processesPerNode": 2}]}),
     "spec.metrics.port", "depends on the sweep as planned (processes per pod)"),
    ("env-reserved-name", with_(pods={"env": [{"name": "MASTER_ADDR", "value": "x"}]}), "spec.pods.env[0].name",
     "a set of names and prefixes, kept in one place (specification/pods.py) with the renderers that set them"),
    ("volume-reserved-name", with_(pods={"volumes": [{"name": "dshm", "mountPath": "/d", "emptyDir": {}}]}),
     "spec.pods.volumes[0].name", "the renderers' own volumes"),
    ("volume-reserved-path", with_(pods={"volumes": [{"name": "d", "mountPath": "/tmp/", "emptyDir": {}}]}),
     "spec.pods.volumes[0].mountPath", "paths compared without their trailing '/'"),
    ("pod-label-ours", with_(pods={"labels": {"gpt2bench.io/role": "x"}}), "spec.pods.labels[gpt2bench.io/role]",
     "map keys"),
    ("job-label-ours", with_(jobMetadata={"labels": {"app.kubernetes.io/name": "x"}}),
     "spec.jobMetadata.labels[app.kubernetes.io/name]", "map keys"),
    ("affinity-key-syntax", with_(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "a b", "operator": "Exists"}]}]}}}),
     "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0].key", "a qualified name's prefix length has no single-pattern form"),
    ("affinity-gt-not-integer", with_(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["many"]}]}]}}}),
     "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0].values", "an integer's syntax in a string"),
    ("spec-larger-than-64KiB", with_(metrics={"podAnnotations": {"note": "x" * 70_000}}), "",
     "object sizes are the API server's, not the schema's; this one is about the copies kubectl and the operator "
     "keep in annotations"),
]


@pytest.mark.parametrize("spec, path, said", [pytest.param(s, p, m, id=i) for i, s, p, m in SHARED])
def test_the_crd_and_the_local_validation_refuse_each_shared_rule(spec, path, said):
    with pytest.raises(SpecError) as local:
        load_benchmark(document(spec))
    assert path in [p for p, _ in local.value.errors], local.value.errors
    with pytest.raises(ApiError) as server:
        validate_custom_resource(document(spec), VERSION, strict=True)
    assert server.value.code == 422 and said in server.value.message, server.value.message


@pytest.mark.parametrize("spec, path, reason", [pytest.param(s, p, r, id=i) for i, s, p, r in LOCAL_ONLY])
def test_local_only_rules_are_refused_here_and_stored_by_the_api_server(spec, path, reason):
    with pytest.raises(SpecError) as local:
        load_benchmark(document(spec))
    assert path in [p for p, _ in local.value.errors], local.value.errors
    validate_custom_resource(document(spec), VERSION, strict=True)  # stored: the operator refuses it (Invalid)


def test_scales_that_differ_in_any_field_are_accepted_by_both():
    spec = sweep(scales=[{"nodes": 1}, {"nodes": 2}, {"processesPerNode": 2}, {"devicesPerNode": 1},
                         {"devicesPerNode": 2}, {"nodes": 2, "devicesPerNode": 2}])
    assert len(load_benchmark(document(spec)).spec.sweep.scales) == 6
    validate_custom_resource(document(spec), VERSION, strict=True)


def test_every_cel_rule_of_the_crd_has_a_shared_case():
    messages = {rule["message"] for rule in _all_rules()}
    uncovered = sorted(m for m in messages if not any(said in m for _, _, _, said in SHARED))
    assert len(messages) >= 15 and uncovered == []


def test_schema_rules_also_hold_for_the_strict_jsonschema_the_other_tests_use():
    """tests/kubeflow_crds.strict + jsonschema (draft 4) is how other tests check documents against CRDs."""
    validator = jsonschema.Draft4Validator(strict(SCHEMA))
    schema_rules = [(i, spec) for i, spec, _, said in SHARED if not _is_list_type_or_cel(said)]
    assert len(schema_rules) >= 20
    for rule, spec in schema_rules:
        assert not validator.is_valid(document(spec)), rule


def _is_list_type_or_cel(said: str) -> bool:
    return "Duplicate value" in said or any(said in rule["message"] for rule in _all_rules())


def _all_rules() -> list[dict]:
    """Every x-kubernetes-validations entry of the CRD's schema."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            found.extend(node.get("x-kubernetes-validations") or [])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(SCHEMA)
    return found


@pytest.mark.parametrize("example", ["cpu-sweep.yaml", "gpu-papers.yaml"])
def test_the_examples_pass_both(example):
    from gpt2bench.specification.documents import parse_document

    doc = parse_document((crd.REPO / "manifests" / "examples" / example).read_bytes())
    load_benchmark(doc)
    validate_custom_resource(doc, VERSION, strict=True)


KUBECTL_SAMPLE = ["snake-case-field", "scale-listed-twice", "bool-as-integer", "quantity-grammar",
                  "warmup-default-not-below-steps", "strategy-listed-twice", "heads-do-not-divide-preset-hidden", "quantity-negative-integer",
                  "too-many-runs"]


@pytest.mark.timeout(180)
def test_kubectl_apply_is_refused_for_a_sample_of_shared_rules(cluster):
    by_id = {i: (s, said) for i, s, _, said in SHARED}
    for number, rule in enumerate(KUBECTL_SAMPLE):
        spec, said = by_id[rule]
        result = cluster.kubectl("apply", "-f", "-", input=json.dumps(document(spec, f"sample-{number}")),
                                 check=False)
        assert result.returncode != 0 and said in result.stderr, (rule, result.stderr)
    accepted = cluster.kubectl("apply", "-f", "-", input=json.dumps(document(LOCAL_ONLY[1][1], "local-only")))
    assert "created" in accepted.stdout
