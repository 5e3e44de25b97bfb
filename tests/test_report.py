"""`gpt2bench report`: the table and the plots from a results document (synthetic here, so every
expected cell is known), from DIR/results.json, and from a GPT2Benchmark read over HTTP by the
kubernetes client (a small fake API server below the client)."""

from __future__ import annotations

import copy
import http.server
import json
import re
import threading
from pathlib import Path
from typing import ClassVar

import matplotlib.image
import pytest
import yaml

from gpt2bench import report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def entry(name, strategy, precision, phase="Succeeded", nodes=1, procs=2, gpus=0, results=None, reason=None):
    e = {
        "name": name,
        "strategy": strategy,
        "precision": precision,
        "nodes": nodes,
        "devicesPerNode": gpus,
        "processesPerNode": procs,
        "jobKind": "PyTorchJob",
        "jobName": name,
        "phase": phase,
        "startTime": "2026-11-22T00:00:00Z",
        "completionTime": "2026-11-22T00:01:00Z",
    }
    if results is not None:
        e["results"] = results
    if reason is not None:
        e["reason"] = reason
    return e


DDP_RESULTS = {
    "worldSize": 8,
    "tokensPerSecond": 12345.678,
    "tokensPerSecondPerDevice": 1543.2097,
    "stepTimeP50Seconds": 0.0123456,
    "stepTimeP95Seconds": 0.02,
    "peakMemoryBytes": 1_572_864_000,
    "trainSeconds": 61.26,
    "startupSeconds": 9.5,
    "finalLoss": 3.14159,
    "gradNorm": 0.98765,
    "mfu": 0.41,
}
SINGLE_RESULTS = {
    "worldSize": 1,
    "tokensPerSecond": 999.4,
    "tokensPerSecondPerDevice": 999.4,
    "stepTimeP50Seconds": 1.5,
    "stepTimeP95Seconds": 2.25,
    "peakMemoryBytes": 104_857_600,
    "trainSeconds": 120.04,
    "finalLoss": 4.5,
    "gradNorm": 12.0,
}


def synthetic_doc() -> dict:
    return {
        "benchmark": "demo",
        "namespace": "team-a",
        "spec": {"model": {"preset": "gpt2"}, "training": {"steps": 50, "seqLen": 1024, "microBatchSize": 8}},
        "runs": [
            entry("demo-ddp-bf16-2x4g", "ddp", "bf16", nodes=2, procs=4, gpus=4, results=DDP_RESULTS),
            entry("demo-single-fp32-1x1g", "single", "fp32", procs=1, gpus=1, results=SINGLE_RESULTS),
            entry(
                "demo-horovod-fp16-2x4g",
                "horovod",
                "fp16",
                phase="Failed",
                nodes=2,
                procs=4,
                gpus=4,
                reason="Horovod is not installed | pip install horovod",
            ),
        ],
        "phase": "PartiallySucceeded",
        "best": {"run": "demo-ddp-bf16-2x4g", "strategy": "ddp", "precision": "bf16", "tokensPerSecond": 12345.678},
        "startTime": "2026-11-22T00:00:00Z",
        "completionTime": "2026-11-22T00:05:00Z",
    }


def write_steps(path: Path, n: int, loss0: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps(
            {"step": s, "warmup": s <= 1, "loss": loss0 - 0.1 * s, "grad_norm": 1.0 / s, "tokens_per_second": 100.0}
        )
        for s in range(1, n + 1)
    ]
    path.write_text("\n".join(lines) + "\n" + '{"step": 99, "loss"')  # a torn last line is skipped


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_table_cells_are_the_documents_values_formatted():
    rows = report.table_rows(synthetic_doc())
    assert rows[0] == [
        "demo-ddp-bf16-2x4g",
        "ddp",
        "bf16",
        "2×4 GPU",
        "12,346",
        "1,543",
        "12.3 / 20.0",
        "1,500.0",
        "61.3",
        "3.1416",
        "0.988",
        "Succeeded",
    ]
    assert rows[1] == [
        "demo-single-fp32-1x1g",
        "single",
        "fp32",
        "1×1 GPU",
        "999",
        "999",
        "1500.0 / 2250.0",
        "100.0",
        "120.0",
        "4.5000",
        "12.000",
        "Succeeded",
    ]
    nothing = report.NO_VALUE
    assert rows[2] == [
        "demo-horovod-fp16-2x4g",
        "horovod",
        "fp16",
        "2×4 GPU",
        nothing,
        nothing,
        f"{nothing} / {nothing}",
        nothing,
        nothing,
        nothing,
        nothing,
        "Failed: Horovod is not installed | pip install horovod",
    ]


def test_markdown_table_has_every_run_and_escapes_pipes():
    table = report.results_table_markdown(synthetic_doc())
    lines = table.strip().splitlines()
    assert len(lines) == 2 + 3  # header, alignment, one row per run
    assert lines[0].startswith("| run | strategy | precision | scale | tokens/s |")
    assert "| Failed: Horovod is not installed \\| pip install horovod |" in lines[4]
    # unescaped pipes delimit exactly one cell per column
    assert all(len(re.split(r"(?<!\\)\|", line)) == len(report.COLUMNS) + 2 for line in lines)


def test_write_report_makes_the_markdown_and_valid_pngs(tmp_path):
    doc = synthetic_doc()
    for i, run in enumerate(doc["runs"]):
        run["stepsFile"] = f"runs/{run['name']}/master-0/steps.jsonl"
        run["runDir"] = f"runs/{run['name']}"
        write_steps(tmp_path / run["stepsFile"], 5, 10.0 + i)
    written = report.write_report(doc, tmp_path)
    names = [p.name for p in written]
    assert names == ["results.md", "throughput.png", "peak_memory.png", "train_time.png", "loss.png", "grad_norm.png"]
    for path in written[1:]:
        assert_png(path)
    markdown = (tmp_path / "results.md").read_text()
    assert "(GPU figures)" in markdown
    assert "Highest throughput: **demo-ddp-bf16-2x4g**" in markdown
    assert report.results_table_markdown(doc) in markdown
    for png in names[1:]:
        assert f"]({png})" in markdown
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def test_steps_reader_skips_a_torn_line(tmp_path):
    write_steps(tmp_path / "steps.jsonl", 3, 10.0)
    records = report.read_steps(tmp_path / "steps.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]


def test_cluster_document_has_bar_charts_and_says_why_no_curves(tmp_path):
    doc = synthetic_doc()  # no stepsFile: a CR status keeps summaries only
    (tmp_path / "loss.png").write_bytes(b"stale")  # from an earlier report of this folder
    written = [p.name for p in report.write_report(doc, tmp_path)]
    assert written == ["results.md", "throughput.png", "peak_memory.png", "train_time.png"]
    assert not (tmp_path / "loss.png").exists()
    markdown = (tmp_path / "results.md").read_text()
    assert "No loss per step curves" in markdown and "cluster's status keeps summaries only" in markdown


def test_no_succeeded_run_means_no_bar_charts(tmp_path):
    doc = synthetic_doc()
    doc["runs"] = [doc["runs"][2]]
    doc["best"] = None
    written = [p.name for p in report.write_report(doc, tmp_path)]
    assert written == ["results.md"]
    markdown = (tmp_path / "results.md").read_text()
    assert "No training throughput plot" in markdown and "1 Failed of 1 runs." in markdown


def test_cli_rebuilds_a_folder(tmp_path, capsys):
    doc = synthetic_doc()
    report.write_results_json(doc, tmp_path)
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "demo-horovod-fp16-2x4g" in out and "12,346" in out  # the table is printed
    assert_png(tmp_path / "throughput.png")
    assert report.results_table_markdown(doc) in (tmp_path / "results.md").read_text()


def test_cli_errors_name_what_is_wrong(tmp_path, capsys):
    assert report.main([str(tmp_path / "nowhere")]) == 2
    assert "results.json does not exist" in capsys.readouterr().err
    (tmp_path / "results.json").write_text("{not json")
    assert report.main([str(tmp_path)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err
    assert report.main([]) == 2
    assert "either DIR or --cluster NAME" in capsys.readouterr().err


class _FakeAPI(http.server.BaseHTTPRequestHandler):
    objects: ClassVar[dict[str, dict]] = {}
    requests: ClassVar[list[str]] = []

    def do_GET(self):  # http.server's naming
        self.requests.append(self.path)
        body = self.objects.get(self.path)
        status = 200 if body else 404
        if body is None:
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_cluster(tmp_path, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeAPI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "test", "user": {"token": "t"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": "team-a"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(path))
    _FakeAPI.objects, _FakeAPI.requests = {}, []
    yield _FakeAPI
    server.shutdown()


def test_cluster_report_reads_the_resource_status(fake_cluster, tmp_path, capsys):
    doc = synthetic_doc()
    resource = {
        "apiVersion": "gpt2bench.io/v1alpha1",
        "kind": "GPT2Benchmark",
        "metadata": {"name": "demo", "namespace": "team-a"},
        "spec": copy.deepcopy(doc["spec"]),
        "status": {k: doc[k] for k in ("runs", "phase", "best", "startTime", "completionTime")},
    }
    url = "/apis/gpt2bench.io/v1alpha1/namespaces/team-a/gpt2benchmarks/demo"
    fake_cluster.objects[url] = resource
    out = tmp_path / "report"
    # the namespace comes from the kubeconfig context when -n is not given
    assert report.main(["--cluster", "demo", "--output", str(out)]) == 0
    # the benchmark, then the ConfigMaps the operator keeps the runs' curves in (none here)
    assert fake_cluster.requests[0] == url and fake_cluster.requests[1].startswith("/api/v1/namespaces/team-a/configmaps")
    saved = json.loads((out / "results.json").read_text())
    assert saved == {**doc}
    assert report.results_table_markdown(doc) in (out / "results.md").read_text()
    for png in ("throughput.png", "peak_memory.png", "train_time.png"):
        assert_png(out / png)
    assert not (out / "loss.png").exists()


def test_cluster_report_says_when_the_benchmark_is_missing(fake_cluster, tmp_path, capsys):
    assert report.main(["--cluster", "absent", "-n", "other", "--output", str(tmp_path / "r")]) == 1
    assert "GPT2Benchmark other/absent: not found" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
