"""The pods' plumbing in a GPT2Benchmark: what a cluster's fabric, registry, identity and data need of the
training pods (`spec.pods`), the job objects' own labels and annotations (`spec.jobMetadata`) and node
affinity (`spec.affinity`). Modelled on what a TrainJob's runtimePatches (Trainer v2.3) and
NeMo-Framework-Launcher's Kubernetes cluster config let users say; the renderers put each field into every
job kind (gpt2bench/render/pods.py), and docs/clusters.md shows which fields make a run use its fabric.

Every rule is the pod validation's (names, keys, paths, one source per volume, one value per variable) or
the project's (names and paths the pods already use are refused, naming the field), checked here, and in
the CRD where CEL can say it (docs/validation.md, Pods).
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import ConfigDict, Field, model_validator

from gpt2bench.conventions import NODE_NAME_ENV, OUTPUT_DIR, OUTPUT_ENV, POD_CPUS_ENV, TRAINER_HOME, TRAINER_UID
from gpt2bench.specification import kubesyntax
from gpt2bench.specification.fielderrors import RuleError
from gpt2bench.specification.kubesyntax import (
    ABSOLUTE_PATH_PATTERN,
    CAPABILITY_PATTERN,
    CONFIG_KEY_PATTERN,
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_PATTERN,
    ENV_NAME_PATTERN,
    shown,
)
from gpt2bench.specification.values import Annotations, Labels, LabelValue, Quantity, SpecModel, cel

DnsSubdomain = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN)]
QualifiedKey = Annotated[str, Field(min_length=1, max_length=kubesyntax.DNS1123_SUBDOMAIN_MAX + 1 + 63)]

# Variables the pods or the Kubeflow controllers already set, which a user's value would silently replace
# (or which Trainer v2's webhooks refuse in trainer.env): refused by name.
RESERVED_ENV = frozenset({
    OUTPUT_ENV, POD_CPUS_ENV, NODE_NAME_ENV, "PYTHONUNBUFFERED", "TORCHINDUCTOR_CACHE_DIR",
    # torchrun's and the training operator's (PyTorchJob), the Job controller's
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "ROLE_RANK", "JOB_COMPLETION_INDEX",
    # Trainer v2's MPI plugin (constants.MPIReservedEnvNames) and mpi-operator's launcher
    "OMPI_MCA_orte_default_hostfile", "OMPI_MCA_orte_keep_fqdn_hostnames", "OMPI_MCA_orte_set_default_slots",
    "OMPI_MCA_plm_rsh_args", "K_MPI_JOB_ROLE",
    # the trainer writes each rank's NCCL log there to record the transport (trainer/fabric.py)
    "NCCL_DEBUG_FILE",
})  # fmt: skip
RESERVED_ENV_PREFIXES = ("GPT2BENCH_", "PET_")  # ours; torchrun's (Trainer v2 refuses PET_* in trainer.env)
# GKE A3 Mega's GPUDirect-TCPXO (NCCL_FASTRAK_*) and A3 High's GPUDirect-TCPX (NCCL_GPUDIRECTTCPX_*) NCCL plugins
# move data only with Google's receive-datapath-manager daemon running as a second container in every pod
# (GoogleCloudPlatform/container-engine-accelerators, gpudirect-tcpxo/nccl-test-latest.yaml: `tcpxo-daemon`).
# The benchmark's pods have one container (a TrainJob's runtime fixes its containers), so a run configured for
# them would silently train over the primary NIC: refused at admission, with the reason.
SIDECAR_FABRIC_ENV_PREFIXES = ("NCCL_FASTRAK_", "NCCL_GPUDIRECTTCPX_")
SIDECAR_FABRIC = ("configures GKE's GPUDirect-TCPXO/TCPX NCCL plugin, which needs Google's RxDM daemon as a "
                  "second container in every training pod; gpt2bench's pods have one container, so NCCL would "
                  "fall back to the primary NIC (docs/clusters.md, GKE A3 Mega / A3 High)")
# Volumes the renderers add (render/pods.py, and the MPI controllers' ssh key and hostfile), and their paths.
RESERVED_VOLUMES = frozenset({"output", "tmp", "cache", "triton", "dshm", "ssh-auth", "mpi-job-config",
                              "mpi-ssh-auth", "mpi-hostfile"})
# Where the pods keep what must not be replaced: results, scratch, shared memory, the ssh key, the hostfile.
RESERVED_MOUNT_PATHS = frozenset({OUTPUT_DIR, "/tmp", "/dev/shm", f"{TRAINER_HOME}/.ssh", "/etc/mpi"})
# The compile and download caches: a volume mounted exactly there takes the place of the pod's emptyDir,
# so that runs on one node (hostPath) or every node (a ReadWriteMany claim) share them (docs/clusters.md).
CACHE_MOUNT_PATHS = (f"{TRAINER_HOME}/.cache", f"{TRAINER_HOME}/.triton")
OWN_LABEL_PREFIXES = ("gpt2bench.io/", "app.kubernetes.io/")


class KeyRef(SpecModel):
    """A key of a Secret or a ConfigMap in the benchmark's namespace."""

    name: DnsSubdomain = Field(description="The Secret's or ConfigMap's name.")
    key: str = Field(min_length=1, max_length=253, pattern=CONFIG_KEY_PATTERN, description="The key in it.")
    optional: bool | None = Field(None, description="Start the pods even when the object or the key is missing.")


class EnvSource(SpecModel):
    """Where a variable's value comes from (exactly one)."""

    model_config = ConfigDict(json_schema_extra=cel(
        ("(has(self.secretKeyRef) ? 1 : 0) + (has(self.configMapKeyRef) ? 1 : 0) == 1",
         "set exactly one of secretKeyRef and configMapKeyRef"),
    ))

    secret_key_ref: KeyRef | None = Field(None, description="A key of a Secret (tokens: HF_TOKEN, ...).")
    config_map_key_ref: KeyRef | None = Field(None, description="A key of a ConfigMap.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvSource:
        if (self.secret_key_ref is None) == (self.config_map_key_ref is None):
            raise RuleError([(("secretKeyRef",), "set exactly one of secretKeyRef and configMapKeyRef")])
        return self


class EnvVar(SpecModel):
    """An environment variable of every training container (and forwarded by mpirun to every rank)."""

    model_config = ConfigDict(json_schema_extra=cel(
        ("!(has(self.value) && has(self.valueFrom))", "set value or valueFrom, not both"),
        (" && ".join(f"!self.name.startsWith('{prefix}')" for prefix in SIDECAR_FABRIC_ENV_PREFIXES),
         f"name: {SIDECAR_FABRIC}"),
    ))

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN,
                      description="Its name (NCCL_SOCKET_IFNAME, FI_PROVIDER, HF_ENDPOINT, HTTPS_PROXY, ...).")
    value: str | None = Field(None, max_length=32768,
                              description="Its value; $(VAR) refers to a variable set before it, $$ is a '$'.")
    value_from: EnvSource | None = Field(None, description="Its value from a Secret or a ConfigMap.")

    @model_validator(mode="after")
    def _one_value_and_not_ours(self) -> EnvVar:
        errors = []
        if self.value is not None and self.value_from is not None:
            errors.append((("valueFrom",), "set value or valueFrom, not both"))
        if self.name in RESERVED_ENV or self.name.startswith(RESERVED_ENV_PREFIXES):
            errors.append((("name",), f"{shown(self.name)} is set by gpt2bench or the Kubeflow controllers in every "
                           "pod: a value here would replace theirs"))
        elif self.name.startswith(SIDECAR_FABRIC_ENV_PREFIXES):
            errors.append((("name",), f"{shown(self.name)} {SIDECAR_FABRIC}"))
        if errors:
            raise RuleError(errors)
        return self


class ClaimSource(SpecModel):
    """A PersistentVolumeClaim in the benchmark's namespace (data and weights for an air-gapped cluster)."""

    claim_name: DnsSubdomain = Field(description="The claim's name.")
    read_only: bool | None = Field(None, description="Mount it read-only.")


HostPathType = Literal["", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice",
                       "BlockDevice"]


class HostPathSource(SpecModel):
    """A path on the node. Not allowed by Pod Security "restricted" (docs/security.md): for fabric plugins
    the node provides (GKE's NCCL plugins) and a per-node compile cache."""

    path: str = Field(min_length=1, max_length=4096, pattern=ABSOLUTE_PATH_PATTERN, description="The node's path.")
    type: HostPathType | None = Field(None, description="What must be there (Directory, DirectoryOrCreate, ...).")


class ConfigMapSource(SpecModel):
    """A ConfigMap's keys as files."""

    name: DnsSubdomain = Field(description="The ConfigMap's name.")
    optional: bool | None = Field(None, description="Start the pods even when it is missing.")


class SecretSource(SpecModel):
    """A Secret's keys as files (e.g. a CA bundle for a proxy)."""

    secret_name: DnsSubdomain = Field(description="The Secret's name.")
    optional: bool | None = Field(None, description="Start the pods even when it is missing.")


class EmptyDirSource(SpecModel):
    """Scratch space that lives as long as the pod."""

    medium: Literal["", "Memory"] | None = Field(None, description="\"\" (the node's disk) or Memory.")
    size_limit: Quantity | None = Field(None, description="At most this much (e.g. 10Gi).")


_SOURCES = ("persistent_volume_claim", "host_path", "config_map", "secret", "empty_dir")
_SOURCE_FIELDS = ("persistentVolumeClaim", "hostPath", "configMap", "secret", "emptyDir")


class ResourceClaimSpec(SpecModel):
    """A dynamic resource allocation claim every training pod makes (resource.k8s.io, Kubernetes 1.34+): the
    devices a DRA driver hands out, e.g. the EFA DRA driver's (EKS) or GKE managed RDMA's (`mrdma.google.com`),
    through a ResourceClaimTemplate (one claim per pod) or a shared ResourceClaim."""

    model_config = ConfigDict(json_schema_extra=cel(
        ("(has(self.resourceClaimTemplateName) ? 1 : 0) + (has(self.resourceClaimName) ? 1 : 0) == 1",
         "set exactly one of resourceClaimTemplateName and resourceClaimName"),
    ))

    name: str = Field(max_length=63, pattern=DNS1123_LABEL_PATTERN,
                      description="The claim's name in the pod (what its training container's resources.claims say).")
    resource_claim_template_name: str | None = Field(
        None, max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN,
        description="A ResourceClaimTemplate in the run's namespace: each pod gets its own claim from it.")
    resource_claim_name: str | None = Field(
        None, max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN,
        description="A ResourceClaim in the run's namespace that every pod shares.")

    @model_validator(mode="after")
    def _one_source(self) -> ResourceClaimSpec:
        if (self.resource_claim_template_name is None) == (self.resource_claim_name is None):
            raise RuleError([(("resourceClaimTemplateName",),
                              "set exactly one of resourceClaimTemplateName and resourceClaimName")])
        return self

    def pod_claim(self) -> dict[str, str]:
        """The pod's `resourceClaims` entry."""
        return self.model_dump(by_alias=True, exclude_none=True)


class VolumeSpec(SpecModel):
    """A volume mounted into every training container: one source, one path."""

    model_config = ConfigDict(json_schema_extra=cel(
        (" + ".join(f"(has(self.{source}) ? 1 : 0)" for source in _SOURCE_FIELDS) + " == 1",
         "set exactly one source: persistentVolumeClaim, hostPath, configMap, secret or emptyDir"),
    ))

    name: str = Field(max_length=63, pattern=DNS1123_LABEL_PATTERN, description="The volume's name in the pods.")
    mount_path: str = Field(max_length=4096, pattern=ABSOLUTE_PATH_PATTERN,
                            description=f"Where the containers see it. At {' or '.join(CACHE_MOUNT_PATHS)} it "
                                        "replaces the pod's own cache (shared compile caches).")
    sub_path: str | None = Field(None, max_length=4096, description="Mount this path of the volume, not its root.")
    read_only: bool | None = Field(None, description="Mount it read-only.")
    persistent_volume_claim: ClaimSource | None = Field(None, description="A PersistentVolumeClaim.")
    host_path: HostPathSource | None = Field(None, description="A path on the node (leaves Pod Security "
                                                               "restricted: docs/security.md).")
    config_map: ConfigMapSource | None = Field(None, description="A ConfigMap.")
    secret: SecretSource | None = Field(None, description="A Secret.")
    empty_dir: EmptyDirSource | None = Field(None, description="An emptyDir.")

    @model_validator(mode="after")
    def _one_source_and_not_ours(self) -> VolumeSpec:
        errors = []
        given = [name for name in _SOURCES if getattr(self, name) is not None]
        if len(given) != 1:
            errors.append(((), f"volume {shown(self.name)} needs exactly one source (persistentVolumeClaim, "
                           f"hostPath, configMap, secret or emptyDir), got {len(given)}"))
        if self.name in RESERVED_VOLUMES:
            errors.append((("name",), f"{shown(self.name)} is a volume the pods already have "
                           f"({', '.join(sorted(RESERVED_VOLUMES))})"))
        path = self.mount_path.rstrip("/") or "/"
        if path in RESERVED_MOUNT_PATHS or path == "/":
            errors.append((("mountPath",), f"{shown(self.mount_path)} is where the pods keep their own files "
                           f"({', '.join(sorted(RESERVED_MOUNT_PATHS))})"))
        if self.sub_path is not None and (self.sub_path.startswith("/") or ".." in self.sub_path.split("/")):
            errors.append((("subPath",), f"{shown(self.sub_path)} must be a relative path without '..'"))
        if errors:
            raise RuleError(errors)
        return self

    def volume(self) -> dict:
        """The pod's `volumes[]` entry."""
        source = next(name for name in _SOURCES if getattr(self, name) is not None)
        dumped = self.model_dump(by_alias=True, exclude_none=True, include={source})
        return {"name": self.name, **dumped}

    def mount(self) -> dict:
        """The container's `volumeMounts[]` entry."""
        mount: dict = {"name": self.name, "mountPath": self.mount_path}
        if self.sub_path is not None:
            mount["subPath"] = self.sub_path
        if self.read_only is not None:
            mount["readOnly"] = self.read_only
        return mount


Capability = Annotated[str, Field(max_length=32, pattern=CAPABILITY_PATTERN,
                                   description="A Linux capability, without CAP_ (IPC_LOCK).")]
UserId = Annotated[int, Field(ge=1, le=2**31 - 1)]


class PodsSpec(SpecModel):
    """What every training pod gets besides what gpt2bench sets: the fabric's environment, capabilities and
    networks, volumes, the registry's and the cluster's identity, and the user it runs as."""

    model_config = ConfigDict(json_schema_extra=cel(
        ("!has(self.env) || self.env.all(e, self.env.exists_one(f, f.name == e.name))",
         "env: each variable once"),
        ("!has(self.volumes) || self.volumes.all(v, self.volumes.exists_one(w, w.name == v.name))",
         "volumes: each name once"),
        ("!has(self.volumes) || self.volumes.all(v, self.volumes.exists_one(w, w.mountPath == v.mountPath))",
         "volumes: each mountPath once"),
        ("!has(self.resourceClaims) || self.resourceClaims.all(c, self.resourceClaims.exists_one(d, d.name == c.name))",
         "resourceClaims: each name once"),
    ))

    env: list[EnvVar] = Field(
        default_factory=list, max_length=64,
        description="Variables of every training container, in order; mpirun forwards each to every rank "
                    "(docs/clusters.md: NCCL_*, FI_*, HF_ENDPOINT, HF_TOKEN from a Secret, HTTPS_PROXY).")
    volumes: list[VolumeSpec] = Field(
        default_factory=list, max_length=32,
        description="Volumes mounted into every training container (data and weights on a claim, a node's "
                    "fabric libraries, shared compile caches).")
    resource_claims: list[ResourceClaimSpec] = Field(
        default_factory=list, max_length=16,
        description="Dynamic resource allocation claims of every training pod, each in its training container's "
                    "resources.claims (an MPIJob's launcher, which trains nothing, makes none). A TrainJob gets "
                    "them through a TrainingRuntime of the benchmark's own in its namespace (docs/clusters.md).")
    capabilities: list[Capability] = Field(
        default_factory=list, max_length=16, json_schema_extra={"x-kubernetes-list-type": "set"},
        description="Linux capabilities added to the training containers. They reach the bounding set only: the "
                    "non-root trainer gets none in effect (IPC_LOCK does not lift its memlock limit: docs/clusters.md, "
                    "Pinned memory). Any but NET_BIND_SERVICE leaves Pod Security restricted (docs/security.md).")
    host_network: bool = Field(
        False, description="Pods in the node's network namespace (fabrics without a device plugin or CNI). "
                           "Leaves Pod Security baseline; not possible with TrainJobs (docs/security.md).")
    labels: Labels = Field(default_factory=dict, description="Extra labels of every training pod.")
    annotations: Annotations = Field(
        default_factory=dict,
        description="Extra annotations of every training pod, e.g. k8s.v1.cni.cncf.io/networks for Multus "
                    "secondary networks (the fabric's NICs).")
    image_pull_secrets: list[Annotated[DnsSubdomain, Field(description="A Secret's name.")]] = Field(
        default_factory=list, max_length=16, json_schema_extra={"x-kubernetes-list-type": "set"},
        description="Secrets (kubernetes.io/dockerconfigjson) to pull the trainer image with.")
    service_account_name: DnsSubdomain | None = Field(
        None, description="The pods' ServiceAccount (registry credentials, cloud identity for data); its token "
                          "is still not mounted (the trainer never calls the API server).")
    run_as_user: UserId | None = Field(
        TRAINER_UID, description=f"The pods' user; null leaves it to the platform (OpenShift's restricted SCC "
                                 f"assigns one). The image's user is {TRAINER_UID}.")
    run_as_group: UserId | None = Field(TRAINER_UID, description="The pods' group; null leaves it to the platform.")
    fs_group: UserId | None = Field(TRAINER_UID, description="The group that owns mounted volumes; null leaves it "
                                                             "to the platform.")

    @model_validator(mode="after")
    def _unique_and_valid_keys(self) -> PodsSpec:
        errors = []
        for field, key in (("env", "name"), ("volumes", "name"), ("volumes", "mount_path")):
            seen: set[str] = set()
            for i, item in enumerate(getattr(self, field)):
                value = getattr(item, key)
                value = value.rstrip("/") if key == "mount_path" else value
                if value in seen:
                    errors.append(((field, i, "mountPath" if key == "mount_path" else key),
                                   f"{shown(value)} is given twice"))
                seen.add(value)
        names = [claim.name for claim in self.resource_claims]
        errors += [(("resourceClaims", i, "name"), f"{shown(name)} is given twice")
                   for i, name in enumerate(names) if name in names[:i]]
        errors += [(("labels", key), problem) for key in self.labels
                   if (problem := kubesyntax.qualified_name_problem(key) or _ours(key))]
        errors += [(("annotations", key), problem) for key in self.annotations
                   if (problem := kubesyntax.qualified_name_problem(key.lower()))]
        if (size := kubesyntax.annotations_size(self.annotations)) > kubesyntax.ANNOTATIONS_MAX_BYTES:
            errors.append((("annotations",), f"keys and values take {size} bytes, more than the API server's "
                           f"{kubesyntax.ANNOTATIONS_MAX_BYTES}"))
        if errors:
            raise RuleError(errors)
        return self

    @property
    def env_names(self) -> list[str]:
        return [item.name for item in self.env]


def _ours(label: str) -> str | None:
    """Labels under gpt2bench.io/ and app.kubernetes.io/ are the project's: selectors rely on them."""
    if label.startswith(OWN_LABEL_PREFIXES):
        return f"is under {' or '.join(OWN_LABEL_PREFIXES)}, whose labels gpt2bench sets (its selectors rely on them)"
    return None


class JobMetadataSpec(SpecModel):
    """Labels and annotations of the job objects (PyTorchJob, MPIJob, TrainJob): what admission policies
    and Kueue read (kueue.x-k8s.io/priority-class, cost centres, ...)."""

    labels: Labels = Field(default_factory=dict, description="Extra labels of every job.")
    annotations: Annotations = Field(default_factory=dict, description="Extra annotations of every job.")

    @model_validator(mode="after")
    def _keys(self) -> JobMetadataSpec:
        errors = [(("labels", key), problem) for key in self.labels
                  if (problem := kubesyntax.qualified_name_problem(key))]
        errors += [(("labels", key), problem) for key in self.labels if (problem := _ours(key))]
        errors += [(("annotations", key), problem) for key in self.annotations
                   if (problem := kubesyntax.qualified_name_problem(key.lower()))]
        if errors:
            raise RuleError(errors)
        return self


# ------------------------------------------------------------------ affinity (core/v1, the parts users set)

NodeOperator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
LabelOperator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
_VALUES_RULE = ("self.operator in ['Exists', 'DoesNotExist'] ? !has(self.values) || size(self.values) == 0 : "
                "(self.operator in ['Gt', 'Lt'] ? has(self.values) && size(self.values) == 1 : "
                "has(self.values) && size(self.values) > 0)")
_VALUES_MESSAGE = "values: none for Exists/DoesNotExist, one for Gt/Lt, at least one for In/NotIn"


def _values_problem(operator: str, values: list[str]) -> str | None:
    if operator in ("Exists", "DoesNotExist") and values:
        return f"must be empty with operator {operator}"
    if operator in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit()):
        return f"must be one integer with operator {operator}"
    if operator in ("In", "NotIn") and not values:
        return f"must not be empty with operator {operator}"
    return None


class _Requirement(SpecModel):
    """A rule on a label: its key is a qualified name and its values fit its operator."""

    @model_validator(mode="after")
    def _rules(self) -> Self:
        errors = []
        if problem := kubesyntax.qualified_name_problem(self.key):
            errors.append((("key",), problem))
        if problem := _values_problem(self.operator, self.values):
            errors.append((("values",), problem))
        if errors:
            raise RuleError(errors)
        return self


class NodeSelectorRequirement(_Requirement):
    """A rule on a node label."""

    model_config = ConfigDict(json_schema_extra=cel((_VALUES_RULE, _VALUES_MESSAGE)))

    key: QualifiedKey = Field(description="The node label (e.g. node.kubernetes.io/instance-type).")
    operator: NodeOperator = Field(description="In, NotIn, Exists, DoesNotExist, Gt or Lt.")
    values: list[Annotated[str, Field(max_length=63, description="A label value (Gt/Lt: an integer).")]] = Field(
        default_factory=list, max_length=64, description="The values the operator compares.")


class NodeSelectorTerm(SpecModel):
    """Requirements that must all hold."""

    match_expressions: list[NodeSelectorRequirement] = Field(min_length=1, max_length=16,
                                                             description="Requirements on node labels.")


class NodeSelector(SpecModel):
    """Terms of which one must hold."""

    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1, max_length=16,
                                                        description="Terms, ORed.")


class PreferredSchedulingTerm(SpecModel):
    """A term the scheduler prefers, with its weight."""

    weight: int = Field(ge=1, le=100, description="1-100.")
    preference: NodeSelectorTerm = Field(description="The term.")


class NodeAffinity(SpecModel):
    """Which nodes the pods may use (required) or prefer."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        None, description="Nodes the pods must run on.")
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = Field(
        default_factory=list, max_length=16, description="Nodes the pods prefer.")


class LabelSelectorRequirement(_Requirement):
    """A rule on a pod label."""

    model_config = ConfigDict(json_schema_extra=cel((_VALUES_RULE, _VALUES_MESSAGE)))

    key: QualifiedKey = Field(description="The pod label.")
    operator: LabelOperator = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[Annotated[LabelValue, Field(description="A label value.")]] = Field(
        default_factory=list, max_length=64, description="The values it compares.")


class LabelSelector(SpecModel):
    """Pods by their labels."""

    match_labels: Labels = Field(default_factory=dict, description="Labels the pods have.")
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=16,
                                                              description="Rules on their labels.")

    @model_validator(mode="after")
    def _keys(self) -> LabelSelector:
        errors = [(("matchLabels", key), problem) for key in self.match_labels
                  if (problem := kubesyntax.qualified_name_problem(key))]
        if errors:
            raise RuleError(errors)
        return self


class PodAffinityTerm(SpecModel):
    """Pods (of the selector) in the same topology domain (topologyKey)."""

    label_selector: LabelSelector = Field(description="Which pods.")
    topology_key: QualifiedKey = Field(description="The node label that makes a domain (kubernetes.io/hostname, "
                                                   "topology.kubernetes.io/zone, a rack or block label).")
    namespaces: list[Annotated[str, Field(max_length=63, pattern=DNS1123_LABEL_PATTERN,
                                          description="A namespace's name.")]] = Field(
        default_factory=list, max_length=16, description="Their namespaces (default: the benchmark's).")

    @model_validator(mode="after")
    def _key(self) -> PodAffinityTerm:
        if problem := kubesyntax.qualified_name_problem(self.topology_key):
            raise RuleError([(("topologyKey",), problem)])
        return self


class WeightedPodAffinityTerm(SpecModel):
    """A pod affinity term the scheduler prefers, with its weight."""

    weight: int = Field(ge=1, le=100, description="1-100.")
    pod_affinity_term: PodAffinityTerm = Field(description="The term.")


class PodAffinity(SpecModel):
    """Pods to run near (affinity) or away from (anti-affinity)."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = Field(
        default_factory=list, max_length=16, description="Terms that must hold.")
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = Field(
        default_factory=list, max_length=16, description="Terms the scheduler prefers.")


class AffinitySpec(SpecModel):
    """The training pods' affinity, passed through (with the run's own spread across nodes added:
    spec.scheduling.spreadAcrossNodes)."""

    node_affinity: NodeAffinity | None = Field(None, description="Which nodes (GPU type, fabric, block).")
    pod_affinity: PodAffinity | None = Field(None, description="Pods to run near (e.g. the same rack).")
    pod_anti_affinity: PodAffinity | None = Field(None, description="Pods to stay away from.")

    def rendered(self) -> dict:
        return self.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)
