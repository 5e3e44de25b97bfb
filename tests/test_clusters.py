"""The fabric profiles (manifests/examples/fabrics/*.yaml, one file per cluster type) and docs/clusters.md's other
spec fragments, each merged into the GPU example and rendered at 2 nodes x 8 GPUs for both backends: valid jobs of
every kind (PyTorchJob, MPIJob, TrainJob) whose every training pod carries the profile's fabric fields; the docs'
per-cluster table and the files agree row for file; the GPU example's own promises (schedules without a GPU
Operator label, the GPUs and GPU-hours docs/quickstart.md quotes)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import repo_scripts
import yaml
from kubeflow_crds import validate_job
from pod_security import violations
from test_render_fabric import pods_of, trains

import gpt2bench
from gpt2bench.plan import gpu_hours, plan_runs
from gpt2bench.render import render_all
from gpt2bench.render.openshift import openshift_objects
from gpt2bench.specification.validation import load_benchmark

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "clusters.md").read_text(encoding="utf-8")
EXAMPLE_FILE = REPO / "manifests" / "examples" / "gpu-papers.yaml"
EXAMPLE = yaml.safe_load(EXAMPLE_FILE.read_text())
FABRICS = REPO / "manifests" / "examples" / "fabrics"
PROFILES = {path.stem: path.read_text(encoding="utf-8") for path in sorted(FABRICS.glob("*.yaml"))}
# The docs' other fragments (the air-gapped data path): not a fabric, rendered the same way.
DOC_FRAGMENTS = dict(re.findall(r"<!-- cluster: ([\w-]+) -->\s*```yaml\n(.*?)```", DOC, re.S))
FRAGMENTS = {**PROFILES, **DOC_FRAGMENTS}
SCALE = {"nodes": 2, "devicesPerNode": 8}  # p5.48xlarge, A3 Ultra, ND H100 v5: 8 GPUs a node


def merged(base: dict, fragment: dict) -> dict:
    """`fragment` over `base`: maps merged key by key, anything else (a list too) replaced, as yq's `*` does."""
    out = copy.deepcopy(base)
    for key, value in fragment.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


PLACEHOLDER = re.compile(r'"<([^<>"]+)>"')


def filled_in(fragment: str) -> str:
    """A fragment as a user fills it in: each quoted `"<value>"` placeholder becomes the value (`"106"`)."""
    return PLACEHOLDER.sub(r'"\1"', fragment)


def placeholders(value) -> list[str]:
    """Every string of a parsed fragment that is a placeholder as a whole (`<106>`)."""
    if isinstance(value, dict):
        return [found for item in value.values() for found in placeholders(item)]
    if isinstance(value, list):
        return [found for item in value for found in placeholders(item)]
    return [value] if isinstance(value, str) and re.fullmatch(r"<[^<>]+>", value) else []


def cluster_benchmark(name: str, backend: str):
    spec = merged(EXAMPLE["spec"], yaml.safe_load(filled_in(FRAGMENTS[name]))["spec"])
    spec["sweep"] = {**spec["sweep"], "scales": [SCALE], "repeats": 1, "precisions": ["bf16"]}
    return load_benchmark({**EXAMPLE, "spec": {**spec, "backend": backend}})


REFUSED = dict(re.findall(r"<!-- refused: ([\w-]+) -->\s*```yaml\n(.*?)```", DOC, re.S))


def table_rows() -> list[dict[str, str]]:
    """docs/clusters.md's per-cluster tables (the profiles' and the clusters without one), one dict per row
    (column header -> cell)."""
    section = DOC.split("\n## Per cluster: the fields that make a run use its fabric\n")[1].split("\n### ")[0]
    rows = []
    for table in re.findall(r"(?:^\|.*\n)+", section, re.M):
        lines = table.splitlines()
        header = [cell.strip() for cell in lines[0].strip("|").split("|")]
        for line in lines[2:]:
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            assert len(cells) == len(header), f"a cell holds a '|': {line[:60]}"
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


ROWS = table_rows()
PROFILE_LINK = re.compile(r"\]\(\.\./manifests/examples/fabrics/([\w-]+)\.yaml\)")
ROW_OF = {name: row for row in ROWS for name in PROFILE_LINK.findall(row["profile"])}


def test_the_profiles_table_is_written_from_the_profiles_and_current():
    """Adding a profile is one file: its row in docs/clusters.md is written from its `#| column: cell` lines."""
    docs_tables = repo_scripts.load("docs_tables")
    path = REPO / "docs" / "clusters.md"
    assert [m["kind"] for m in docs_tables.SECTION.finditer(DOC)] == ["fabrics"]
    assert docs_tables.rewritten(DOC, path) == DOC, "run python scripts/docs_tables.py --write"
    rows = docs_tables.SECTION.search(DOC)["body"].splitlines()[2:]
    assert [PROFILE_LINK.findall(row) for row in rows] == [[name] for name in sorted(PROFILES)]


def test_a_profile_whose_docs_row_lacks_a_column_is_named_with_it(tmp_path, monkeypatch):
    docs_tables = repo_scripts.load("docs_tables")
    monkeypatch.setattr(docs_tables, "FABRICS", tmp_path)
    (tmp_path / "new-cloud.yaml").write_text(PROFILES["ethernet"].replace("#| nccl:", "#| ncll:"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"clusters.md: new-cloud.yaml: its docs row lacks `#\| nccl:`; has unknown "
                                         r"columns ncll"):
        docs_tables.rewritten(DOC, REPO / "docs" / "clusters.md")
    (tmp_path / "new-cloud.yaml").write_text(PROFILES["ethernet"].replace("#| cluster: any cluster, plain Ethernet",
                                                                          "#| cluster: New Cloud"), encoding="utf-8")
    new = docs_tables.rewritten(DOC, REPO / "docs" / "clusters.md")
    assert "| New Cloud | [new-cloud.yaml](../manifests/examples/fabrics/new-cloud.yaml) | TCP |" in new
    assert "[aks-nd.yaml]" not in docs_tables.SECTION.search(new)["body"]


def test_every_profile_file_has_a_row_of_the_table_and_every_row_a_file():
    """A file without a row, a row linking no file (or one that is not there) fails. A row without a file says why: its fragment is refused (the docs' refused block, tested below), or
    it is OpenShift, which takes the row of its fabric (every profile is admitted there: tested below)."""
    assert PROFILES, "manifests/examples/fabrics/ holds the profiles"
    linked = [name for row in ROWS for name in PROFILE_LINK.findall(row["profile"])]
    assert sorted(linked) == sorted(PROFILES)  # each file once, no link to a file that is not there
    for row in ROWS:
        if PROFILE_LINK.search(row["profile"]):
            continue
        refused = re.findall(r"refused: `([\w-]+)`", row["profile"])
        assert (refused and set(refused) <= set(REFUSED)) or row["profile"].startswith("its fabric's"), row["cluster"]


def env_values(spec: dict) -> dict[str, str]:
    return {item["name"]: item.get("value") for item in spec.get("pods", {}).get("env", [])}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_each_rows_values_are_its_profiles(name):
    """What the table says of a cluster is what its file holds: `require`, the gIB script, every `NAME=value` (one
    cut short with `…` as its start), the first device plugin resource (with its amount where the row gives one)."""
    row, spec = ROW_OF[name], yaml.safe_load(filled_in(PROFILES[name]))["spec"]
    fields = row["`spec.fabric`, `spec.pods`"]
    assert re.findall(r"`require: (\w+)`", fields) == [spec["fabric"]["require"]]
    assert re.findall(r"`ncclEnvScript: ([^`]+)`", fields) == (
        [spec["fabric"]["ncclEnvScript"]] if "ncclEnvScript" in spec["fabric"] else [])
    env = env_values(spec)
    pairs = [m.groups() for token in re.findall(r"`([^`]+)`", " ".join(row.values()))
             if (m := re.fullmatch(r"([A-Z][A-Z0-9_]*)=(.+)", token))]
    for variable, value in pairs:
        assert variable in env and (env[variable].startswith(value[:-1]) if value.endswith("…")
                                    else env[variable] == value), (variable, value)
    resources = [token for token in re.findall(r"`([^`]+)`", row["device plugin resource (`spec.resources`)"])
                 if re.fullmatch(r"[\w.-]+/[\w.-]+(: \d+)?", token)]
    if resources:
        resource, _, amount = resources[0].partition(": ")
        assert resource in spec["resources"]["limits"], resource
        assert not amount or spec["resources"]["limits"][resource] == int(amount), resources[0]


@pytest.mark.parametrize("backend", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("name", sorted(FRAGMENTS))
def test_each_clusters_fields_reach_every_training_pod_of_every_job_kind(name, backend):
    bench = cluster_benchmark(name, backend)
    fragment = yaml.safe_load(filled_in(FRAGMENTS[name]))["spec"]
    pods = fragment.get("pods", {})
    jobs = render_all(bench)
    assert {job["kind"] for job in jobs} == ({"TrainJob"} if backend == "trainjob" else {"PyTorchJob", "MPIJob"})
    assert any(run.nodes == SCALE["nodes"] and run.devices_per_node == SCALE["devicesPerNode"]
               for run in plan_runs(bench))
    restricted = ROW_OF[name]["Pod Security"].startswith("restricted") if name in ROW_OF else None
    for job in jobs:
        validate_job(job)
        for role, pod in pods_of(job).items():
            if not trains(job, role):
                continue
            where = f"{name} {job['metadata']['name']} {role}"
            (container,) = pod["spec"]["containers"]
            env = {item["name"]: item for item in container.get("env", [])}
            for item in pods.get("env", []):
                assert env[item["name"]] == item, where
            for volume in pods.get("volumes", []):
                assert volume["name"] in {v["name"] for v in pod["spec"]["volumes"]}, where
                assert volume["mountPath"] in {m["mountPath"] for m in container["volumeMounts"]}, where
            for key, value in pods.get("annotations", {}).items():
                assert pod["metadata"]["annotations"][key] == value, where
            assert container["securityContext"]["capabilities"].get("add", []) == pods.get("capabilities", []), where
            limits = container.get("resources", {}).get("limits", {})
            for resource, amount in fragment.get("resources", {}).get("limits", {}).items():
                assert limits[resource] == amount, where
            for key, value in fragment.get("nodeSelector", {}).items():
                assert pod["spec"]["nodeSelector"][key] == value, where
            if fragment.get("fabric", {}).get("require"):
                assert env["GPT2BENCH_FABRIC"]["value"] == fragment["fabric"]["require"], where
            # only what the row says leaves "restricted" does
            expected = ({"capabilities"} if pods.get("capabilities") else set()) | (
                {"hostPathVolumes", "restrictedVolumes"} if any("hostPath" in v for v in pods.get("volumes", []))
                else set())
            found = {v.split(":")[0] for v in violations(pod)}
            assert found == expected, where
            assert restricted is None or restricted == (found == set()), f"{where}: the row's Pod Security"


def test_the_gpu_example_needs_no_gpu_operator_label_and_requests_its_gpus():
    """nvidia.com/gpu.present exists only where the GPU Operator's feature discovery runs: the example schedules
    by the resource it requests, which every GPU device plugin offers."""
    bench = load_benchmark({**EXAMPLE, "spec": {**EXAMPLE["spec"], "backend": "pytorchjob"}})
    assert bench.spec.node_selector == {} and not bench.spec.scheduling.gang
    for job in render_all(bench):
        for role, pod in pods_of(job).items():
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            assert "nodeSelector" not in pod["spec"]
            assert limits.get("nvidia.com/gpu", 0) >= (1 if trains(job, role) else 0)
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_what_the_quick_start_says_the_gpu_example_holds():
    page = (REPO / "docs" / "quickstart.md").read_text(encoding="utf-8")
    section = page.split("## The GPU example: what it holds")[1].split("\n## ")[0]
    bench = load_benchmark(EXAMPLE)
    runs = plan_runs(bench)
    by_gpus = {gpus: sum(run.gpus_held == gpus for run in runs) for gpus in (1, 4, 8)}
    assert by_gpus == {1: 12, 4: 60, 8: 60} and len(runs) == 132  # a breakdown round and 3 decision rounds
    deadline = bench.spec.run_policy.active_deadline_seconds
    quoted = {
        "runs": len(runs), "GPU-runs": sum(run.gpus_held for run in runs),
        "GPU-hours at most": gpu_hours(runs, deadline), "GPU-hours at 3 minutes a run": gpu_hours(runs, 180),
        "hours of wall time at 3 minutes a run": len(runs) * 180 / 3600,
        "USD at 2.50 per GPU-hour": gpu_hours(runs, 180) * 2.5,
    }
    for what, value in quoted.items():
        text = f"{value:,.2f}".rstrip("0").rstrip(".")
        assert f"{text} {what}" in section, (what, text)


def env_of(bench) -> dict[str, str]:
    return {item.name: item.value for item in bench.spec.pods.env}


def test_each_profile_carries_the_values_its_provider_publishes():
    """The values each file's header cites: AKS excludes its Ethernet mlx5 device instead of naming a device no AKS
    node has; on-prem names its HCAs exactly (a bare `mlx5` prefix also matches a management NIC); RoCE sets a
    traffic class and leaves the GID to NCCL; gIB sources the node's script and attaches gvnic-1; EKS runs this
    version's -cuda-efa image; plain Ethernet measures sockets on purpose; no profile adds IPC_LOCK, which never
    reaches the non-root trainer."""
    aks = env_of(cluster_benchmark("aks-nd", "pytorchjob"))
    assert aks["NCCL_IB_HCA"] == "^mlx5_8" and aks["NCCL_TOPO_FILE"] == "/opt/nvidia-topology/topo.xml"
    assert "kubernetes.azure.com/agentpool" in cluster_benchmark("aks-nd", "pytorchjob").spec.node_selector
    for name in ("onprem-ib", "onprem-roce"):
        hcas = env_of(cluster_benchmark(name, "pytorchjob"))["NCCL_IB_HCA"]
        assert hcas.startswith("=") and all(part.startswith("mlx5_") for part in hcas[1:].split(","))
    roce = env_of(cluster_benchmark("onprem-roce", "pytorchjob"))
    assert "NCCL_IB_TC" in roce and "NCCL_IB_GID_INDEX" not in roce
    gke = cluster_benchmark("gke-a3-ultra", "pytorchjob")
    assert gke.spec.fabric.nccl_env_script == "/usr/local/gib/scripts/set_nccl_env.sh"
    assert '"network":"gvnic-1"' in gke.spec.pods.annotations["networking.gke.io/interfaces"]
    eks = cluster_benchmark("eks-efa", "pytorchjob")
    assert env_of(eks)["FI_PROVIDER"] == "efa" and env_of(eks)["FI_EFA_FORK_SAFE"] == "1"
    assert eks.spec.images.gpu.endswith(f":{gpt2bench.__version__}-cuda-efa")
    ethernet = cluster_benchmark("ethernet", "pytorchjob")
    assert ethernet.spec.fabric.require == "none" and env_of(ethernet)["NCCL_SOCKET_IFNAME"]
    for name in FRAGMENTS:
        assert cluster_benchmark(name, "pytorchjob").spec.pods.capabilities == [], name


def test_the_tcpxo_fragment_is_refused_at_admission_with_the_reason():
    from kube.semantics import ApiError, validate_custom_resource
    from test_validation_rules import VERSION

    from gpt2bench.specification.validation import SpecError

    fragment = yaml.safe_load(REFUSED["gke-a3-mega"])["spec"]
    document = {**EXAMPLE, "spec": merged(EXAMPLE["spec"], fragment)}
    with pytest.raises(SpecError) as refused:
        load_benchmark(document)
    (path, message), = refused.value.errors
    assert path == "spec.pods.env[0].name" and "RxDM daemon as a second container" in message
    with pytest.raises(ApiError, match="RxDM daemon as a second container"):
        validate_custom_resource(document, VERSION, strict=True)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_the_mpi_launcher_takes_none_of_the_fabric_and_open_mpi_follows_nccls_interfaces(name):
    bench = cluster_benchmark(name, "pytorchjob")
    launcher_pod = next(pods_of(job)["Launcher"] for job in render_all(bench)
                        if job["kind"] == "MPIJob" and job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] > 1)
    annotations = launcher_pod["metadata"].get("annotations") or {}
    assert not {"k8s.v1.cni.cncf.io/networks", "networking.gke.io/interfaces"} & set(annotations)
    assert "nodeSelector" not in launcher_pod["spec"]
    (container,) = launcher_pod["spec"]["containers"]
    assert "add" not in container["securityContext"]["capabilities"]
    command = container["command"]
    ifname = env_of(bench).get("NCCL_SOCKET_IFNAME")
    mca = {command[i + 1]: command[i + 2] for i, word in enumerate(command) if word == "-mca"}
    if ifname and ifname.startswith("^"):
        assert mca["btl_tcp_if_exclude"] == mca["oob_tcp_if_exclude"] == "127.0.0.1/8," + ifname[1:]
    elif ifname:
        assert mca["btl_tcp_if_include"] == mca["oob_tcp_if_include"] == ifname.lstrip("=")


@pytest.mark.parametrize("backend", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_on_openshift_every_profiles_pods_are_admitted_under_what_render_openshift_prints(name, backend):
    """The table's OpenShift row: a profile as it is, plus what `gpt2bench render --openshift` prints. The SCC that
    admits the pods is the benchmark's own where it prints one (a hostPath, a capability), else nonroot-v2, which
    it binds; every pod of every job kind passes OpenShift's SCC admission as tests/test_openshift.py plays it."""
    from test_openshift import DEFAULT_SCCS, admission_problems, scc_validator

    bench = cluster_benchmark(name, backend)
    objects = openshift_objects(bench)
    own = [o for o in objects if o["kind"] == "SecurityContextConstraints"]
    if own:
        assert list(scc_validator().iter_errors(own[0])) == []
    else:
        assert [o["roleRef"]["name"] for o in objects] == ["system:openshift:scc:nonroot-v2"]
    scc = own[0] if own else DEFAULT_SCCS["nonroot-v2"]
    for job in render_all(bench):
        for role, pod in pods_of(job).items():
            assert admission_problems(scc, pod) == [], (name, job["metadata"]["name"], role)


def docs_merge_commands() -> dict[str, str]:
    """The yq expressions docs/clusters.md's "Using a profile" gives, by yq flavour."""
    section = DOC.split("\n### Using a profile\n")[1].split("\n## ")[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, re.S)
    return {"mikefarah": re.search(r"yq eval-all '([^']+)'", block)[1], "jq": re.search(r"yq -y -s '([^']+)'", block)[1]}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_the_documented_yq_merge_gives_the_benchmark_these_tests_render(name, tmp_path):
    """The docs' command, with the yq on PATH (Mike Farah's yq 4 or the jq wrapper pip installs), merges a profile
    into the GPU example exactly as `merged` does here; `gpt2bench validate` then names every value still in angle
    brackets, or passes the file."""
    yq = shutil.which("yq")
    if yq is None:
        pytest.skip("no yq on PATH")
    version = subprocess.run([yq, "--version"], capture_output=True, text=True, timeout=30).stdout
    expression = docs_merge_commands()["mikefarah" if "mikefarah" in version else "jq"]
    command = [yq, "eval-all", expression] if "mikefarah" in version else [yq, "-y", "-s", expression]
    out = subprocess.run([*command, str(EXAMPLE_FILE), str(FABRICS / f"{name}.yaml")], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    assert yaml.safe_load(out) == merged(EXAMPLE, yaml.safe_load(PROFILES[name]))
    benchmark = tmp_path / "my-benchmark.yaml"
    benchmark.write_text(out, encoding="utf-8")
    checked = subprocess.run(["gpt2bench", "validate", str(benchmark)], capture_output=True, text=True, timeout=60)
    left = placeholders(yaml.safe_load(PROFILES[name]))
    assert checked.returncode == (2 if left else 0), checked.stderr
    assert all(f"{value!r} is a placeholder" in checked.stderr for value in left), checked.stderr
