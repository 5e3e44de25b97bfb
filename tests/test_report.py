"""`gpt2bench report` and `gpt2bench compare`: the tables, results.md, results.csv and the plots from a results
document (synthetic here, so every expected cell is known), from DIR/results.json, and from a GPT2Benchmark
read over HTTP by the kubernetes client (a small fake API server below the client)."""

from __future__ import annotations

import copy
import csv
import json
import math
import re
import statistics
from pathlib import Path

import kubernetes
import matplotlib.colors
import matplotlib.image
import pytest
import yaml

from gpt2bench import report
from gpt2bench.report import cli, compare, plots, table
from gpt2bench.report.export import COLUMNS, RESULTS_CSV
from gpt2bench.report.steps import read_steps
from gpt2bench.status import ResultsDocument

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
H100 = "NVIDIA H100 80GB HBM3"


def entry(name, strategy, precision, phase="Succeeded", nodes=1, procs=2, gpus=0, results=None, reason=None):
    e = {
        "name": name, "strategy": strategy, "precision": precision, "nodes": nodes, "devicesPerNode": gpus,
        "processesPerNode": procs, "jobKind": "PyTorchJob", "jobName": name, "phase": phase,
        "startTime": "2026-11-22T00:00:00Z", "completionTime": "2026-11-22T00:01:00Z",
    }  # fmt: skip
    if results is not None:
        e["results"] = results
    if reason is not None:
        e["reason"] = reason
    return e


DDP_RESULTS = {
    "worldSize": 8, "tokensPerSecond": 12345.678, "tokensPerSecondPerDevice": 1543.2097,
    "stepTimeP50Seconds": 0.0123456, "stepTimeP95Seconds": 0.02, "peakMemoryBytes": 1_572_864_000,
    "trainSeconds": 61.26, "startupSeconds": 9.5, "finalLoss": 3.14159, "gradNorm": 0.98765, "mfu": 0.41,
    "deviceName": H100,
}  # fmt: skip
SINGLE_RESULTS = {
    "worldSize": 1, "tokensPerSecond": 999.4, "tokensPerSecondPerDevice": 999.4, "stepTimeP50Seconds": 1.5,
    "stepTimeP95Seconds": 2.25, "peakMemoryBytes": 104_857_600, "trainSeconds": 120.04, "finalLoss": 4.5,
    "gradNorm": 12.0, "deviceName": H100,
}  # fmt: skip


def synthetic(**changes) -> dict:
    doc = {
        "benchmark": "demo",
        "namespace": "team-a",
        "spec": {"model": {"preset": "gpt2"}, "training": {"steps": 50, "seqLen": 1024, "microBatchSize": 8}},
        "runs": [
            entry("demo-ddp-bf16-2x4g", "ddp", "bf16", nodes=2, procs=4, gpus=4, results=DDP_RESULTS),
            entry("demo-single-fp32-1x1g", "single", "fp32", procs=1, gpus=1, results=SINGLE_RESULTS),
            entry("demo-horovod-fp16-2x4g", "horovod", "fp16", phase="Failed", nodes=2, procs=4, gpus=4,
                  reason="Horovod is not installed | pip install horovod"),
        ],
        "phase": "PartiallySucceeded",
        "best": {"run": "demo-ddp-bf16-2x4g", "strategy": "ddp", "precision": "bf16", "tokensPerSecond": 12345.678},
        "startTime": "2026-11-22T00:00:00Z",
        "completionTime": "2026-11-22T00:05:00Z",
    }
    return doc | changes


def synthetic_doc(**changes) -> ResultsDocument:
    return ResultsDocument.read(synthetic(**changes))


def write_steps(path: Path, n: int, loss0: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": s, "warmup": s <= 1, "loss": loss0 - 0.1 * s, "grad_norm": 1.0 / s,
                         "tokens_per_second": 100.0, "step_seconds": 0.5}) for s in range(1, n + 1)]
    path.write_text("\n".join(lines) + "\n" + '{"step": 99, "loss"')  # a torn last line is skipped


def with_steps(doc: ResultsDocument, directory: Path, n: int = 5) -> ResultsDocument:
    for i, run in enumerate(doc.runs):
        run.steps_file = f"runs/{run.name}/master-0/steps.jsonl"
        run.run_dir = f"runs/{run.name}"
        write_steps(directory / run.steps_file, n, 10.0 + i)
    return doc


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


# ---------------------------------------------------------------- the runs table
def test_table_cells_are_the_documents_values_formatted():
    rows = table.table_rows(synthetic_doc())
    assert rows[0] == ["demo-ddp-bf16-2x4g", "ddp", "bf16", "2×4 GPU", "12,346", "1,543", "12.3 / 20.0", "1,500.0",
                       "61.3", "3.1416", "0.988", "— / —", "Succeeded"]  # no threads/cores in this document
    assert rows[1] == ["demo-single-fp32-1x1g", "single", "fp32", "1×1 GPU", "999", "999", "1500.0 / 2250.0",
                       "100.0", "120.0", "4.5000", "12.000", "— / —", "Succeeded"]
    nothing = table.NO_VALUE
    assert rows[2] == ["demo-horovod-fp16-2x4g", "horovod", "fp16", "2×4 GPU", nothing, nothing,
                       f"{nothing} / {nothing}", nothing, nothing, nothing, nothing, f"{nothing} / {nothing}",
                       "Failed: Horovod is not installed | pip install horovod"]


def test_scale_column_counts_workers_not_parameter_servers():
    doc = synthetic_doc(runs=[entry("demo-ps-fp32-1x2", "ps", "fp32", procs=3) | {"devices": 2}])
    assert table.table_rows(doc)[0][3] == "1×2 CPU"


def test_markdown_table_has_every_run_and_escapes_pipes():
    lines = table.results_table_markdown(synthetic_doc()).strip().splitlines()
    assert len(lines) == 2 + 3  # header, alignment, one row per run
    assert lines[0].startswith("| run | strategy | precision | scale | tokens/s |")
    assert "| Failed: Horovod is not installed \\| pip install horovod |" in lines[4]
    # unescaped pipes delimit exactly one cell per column
    assert all(len(re.split(r"(?<!\\)\|", line)) == len(table.COLUMNS) + 2 for line in lines)


# ---------------------------------------------------------------- the report files
def test_write_report_makes_every_file_and_puts_the_recommendation_first(tmp_path):
    doc = with_steps(synthetic_doc(), tmp_path)
    written = [p.name for p in report.write_report(doc, tmp_path)]
    assert written == ["results.json", "results.csv", "results.md", "throughput.png", "peak_memory.png",
                       "train_time.png", "grad_norm.png", "loss.png", "loss_time.png", "grad_norm_steps.png"]
    for name in written[3:]:
        assert_png(tmp_path / name)
    markdown = (tmp_path / "results.md").read_text()
    assert f"(GPU figures, {H100})" in markdown and "Highest throughput" not in markdown
    headline = ("**At the largest scale measured (2×4 GPU): ddp bf16 is the only configuration measured**, "
                "12,346 tokens/s.")
    assert headline in markdown
    assert markdown.index("## Recommendation") < markdown.index("## The papers' findings") < markdown.index("## Runs")
    assert "Not compared at 2×4 GPU (did not succeed): demo-horovod-fp16-2x4g (Failed)." in markdown
    assert table.results_table_markdown(doc) in markdown
    assert "No scaling plot: every strategy and precision ran at one scale only." in markdown
    for png in written[3:]:
        assert f"]({png})" in markdown
    saved = ResultsDocument.load(tmp_path)
    assert saved.analysis == doc.analysis and saved.analysis.recommended.run == "demo-ddp-bf16-2x4g"
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def test_csv_has_one_row_per_run_with_every_figure_and_the_derived_ones(tmp_path):
    doc = synthetic_doc(spec={"cost": {"gpuHour": 2.0, "nodeHour": 1.0, "currency": "EUR"}})
    report.write_report(doc, tmp_path)
    with open(tmp_path / RESULTS_CSV, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["name"] for r in rows] == [r.name for r in doc.runs] and list(rows[0]) == COLUMNS
    ddp, single, failed = rows
    assert float(ddp["tokensPerSecond"]) == 12345.678 and int(ddp["peakMemoryBytes"]) == 1_572_864_000
    assert ddp["scale"] == "2×4 GPU" and ddp["devices"] == "8" and ddp["deviceName"] == H100
    assert float(ddp["hourlyPrice"]) == 2.0 * 8 + 1.0 * 2 and ddp["currency"] == "EUR"
    assert float(ddp["costPer1MTokens"]) == pytest.approx(18 / (12345.678 * 3600) * 1e6)
    assert float(single["costPer1MTokens"]) == pytest.approx(3 / (999.4 * 3600) * 1e6)
    assert failed["phase"] == "Failed" and failed["tokensPerSecond"] == "" and failed["costPer1MTokens"] == ""
    assert "Horovod is not installed" in failed["reason"]
    assert all(r["scalingEfficiency"] == "" for r in rows)  # one scale per strategy: not measurable


def test_csv_and_markdown_carry_scaling_efficiency(tmp_path):
    def ddp(name, gpus, per_device):
        results = {**DDP_RESULTS, "worldSize": gpus, "tokensPerSecond": gpus * per_device,
                   "tokensPerSecondPerDevice": per_device}
        return entry(name, "ddp", "bf16", procs=gpus, gpus=gpus, results=results)
    doc = synthetic_doc(runs=[ddp("demo-ddp-bf16-1x1g", 1, 1000.0), ddp("demo-ddp-bf16-1x4g", 4, 800.0)])
    written = [p.name for p in report.write_report(doc, tmp_path)]
    assert "scaling.png" in written
    with open(tmp_path / RESULTS_CSV, newline="") as f:
        efficiencies = [r["scalingEfficiency"] for r in csv.DictReader(f)]
    assert efficiencies == ["", "0.8"]
    markdown = (tmp_path / "results.md").read_text()
    assert "| ddp | bf16 | 1×4 GPU | 4 | 800 | 0.80 |" in markdown
    assert "| ddp | bf16 | 1×1 GPU | 1 | 1,000 | 1 (baseline) |" in markdown
    # Li 2020 wants ≥ 0.9; 0.8 from one measurement per configuration decides nothing
    assert "scaling efficiency: 0.80 (single measurement)" in markdown
    assert "**not decided: needs 3 measurements or more**" in markdown and "**does not hold**" not in markdown


def test_repeats_add_a_configurations_table_with_mean_and_spread(tmp_path):
    runs = []
    for k, tps in enumerate((100.0, 110.0, 120.0), start=1):
        results = {**SINGLE_RESULTS, "tokensPerSecond": tps, "tokensPerSecondPerDevice": tps}
        runs.append(entry(f"demo-single-fp32-1x1g-r{k}", "single", "fp32", procs=1, gpus=1, results=results)
                    | {"repeat": k})
    doc = synthetic_doc(runs=runs)
    report.write_report(doc, tmp_path)
    markdown = (tmp_path / "results.md").read_text()
    gm, noise = (100 * 110 * 120) ** (1 / 3), statistics.stdev(map(math.log, (100, 110, 120)))
    assert f"| demo-single-fp32-1x1g | 1×1 GPU | 3/3 | {gm:,.0f} ± {noise:.1%} | {gm:,.0f} ± {noise:.1%} |" in markdown
    assert doc.analysis.recommended.run == "demo-single-fp32-1x1g"


def test_every_plot_is_titled_with_what_and_where_grouped_by_strategy_coloured_by_precision(tmp_path, monkeypatch):
    seen = {}
    save = plots._save

    def record(fig, path):
        texts = [fig._suptitle.get_text()] if fig._suptitle else []
        seen[path.name] = (texts + [ax.get_title() for ax in fig.axes], fig.axes)
        save(fig, path)

    monkeypatch.setattr(plots, "_save", record)
    runs = [entry(f"demo-{s}-{p}-1x2g", s, p, procs=2, gpus=2,
                  results={**DDP_RESULTS, "tokensPerSecond": tps, "tokensPerSecondPerDevice": tps / 2})
            for s, p, tps in (("ddp", "fp32", 100.0), ("ddp", "bf16", 150.0), ("fsdp", "fp32", 90.0),
                              ("fsdp", "bf16", 140.0))]
    runs.append(entry("demo-ddp-bf16-1x1g", "ddp", "bf16", procs=1, gpus=1,
                      results={**DDP_RESULTS, "tokensPerSecondPerDevice": 80.0}))
    doc = with_steps(synthetic_doc(runs=runs), tmp_path)
    report.write_report(doc, tmp_path)
    assert set(seen) == set(plots.ALL_PLOTS) - {"breakdown.png"}  # no breakdown in these results
    measured = {"throughput.png": "throughput", "peak_memory.png": "Peak memory", "train_time.png": "Training time",
                "grad_norm.png": "gradient norm", "loss.png": "Loss per step", "loss_time.png": "wall-clock second",
                "grad_norm_steps.png": "Gradient norm per step", "scaling.png": "Scaling efficiency"}
    for name, (titles, _) in seen.items():
        text = " ".join(titles)
        assert H100 in text and measured[name].lower() in text.lower(), (name, text)
    _, axes = seen["throughput.png"]
    panel = next(ax for ax in axes if ax.get_title() == "1×2 GPU")
    assert [t.get_text() for t in panel.get_xticklabels()] == ["ddp", "fsdp"]
    fp32, bf16 = (plots.PRECISION_COLOURS[p].lower() for p in ("fp32", "bf16"))
    bars = sorted((bar.get_x(), matplotlib.colors.to_hex(bar.get_facecolor()), bar.get_height())
                  for bar in panel.patches)
    # left to right: ddp's pair then fsdp's, each fp32 then bf16, below their strategy's tick (0 and 1)
    assert [(colour, height) for _, colour, height in bars] == [(fp32, 100.0), (bf16, 150.0), (fp32, 90.0),
                                                                (bf16, 140.0)]
    assert [round(x + bar.get_width() / 2) for (x, *_), bar in zip(bars, panel.patches)] == [0, 0, 1, 1]


def test_steps_reader_skips_a_torn_line(tmp_path):
    write_steps(tmp_path / "steps.jsonl", 3, 10.0)
    assert [r["step"] for r in read_steps(tmp_path / "steps.jsonl")] == [1, 2, 3]


def test_cluster_document_has_bar_charts_and_says_why_no_curves(tmp_path):
    doc = synthetic_doc()  # no stepsFile: a CR status keeps summaries only
    (tmp_path / "loss.png").write_bytes(b"stale")  # from an earlier report of this folder
    written = [p.name for p in report.write_report(doc, tmp_path)]
    assert written[3:] == ["throughput.png", "peak_memory.png", "train_time.png", "grad_norm.png"]
    assert not (tmp_path / "loss.png").exists()
    markdown = (tmp_path / "results.md").read_text()
    assert "No loss per step curves" in markdown and "cluster's status keeps summaries only" in markdown
    assert "final loss: no per-step records" not in markdown  # one strategy per scale: no such comparison


def test_no_succeeded_run_means_no_plots_and_no_recommendation(tmp_path):
    doc = synthetic_doc()
    doc.runs = [doc.runs[2]]
    written = [p.name for p in report.write_report(doc, tmp_path)]
    assert written == ["results.json", "results.csv", "results.md"]
    markdown = (tmp_path / "results.md").read_text()
    assert "No training throughput plot" in markdown and "1 Failed of 1 runs." in markdown
    assert "No recommendation: no run succeeded." in markdown


# ---------------------------------------------------------------- the CLI
def test_cli_rebuilds_a_folder(tmp_path, capsys):
    doc = synthetic_doc()
    doc.save(tmp_path)
    assert cli.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "demo-horovod-fp16-2x4g" in out and "12,346" in out  # the table is printed
    assert "At the largest scale measured (2×4 GPU): ddp bf16 is the only configuration measured" in out
    assert_png(tmp_path / "throughput.png")
    assert table.results_table_markdown(doc) in (tmp_path / "results.md").read_text()
    assert ResultsDocument.load(tmp_path).analysis is not None  # results.json now holds the analysis


def test_cli_errors_name_what_is_wrong(tmp_path, capsys):
    assert cli.main([str(tmp_path / "nowhere")]) == 2
    assert "results.json does not exist" in capsys.readouterr().err
    (tmp_path / "results.json").write_text("{not json")
    assert cli.main([str(tmp_path)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err
    bad = synthetic()
    bad["runs"][0]["phase"] = "Exploded"
    (tmp_path / "results.json").write_text(json.dumps(bad))
    assert cli.main([str(tmp_path)]) == 2
    assert "is not a results document: runs.0.phase: Input should be" in capsys.readouterr().err
    assert cli.main([]) == 2
    assert "either DIR or --cluster NAME" in capsys.readouterr().err


def test_the_console_script_dispatches_report_and_compare(tmp_path, capsys):
    from gpt2bench import cli as top

    synthetic_doc().save(tmp_path)
    assert top.main(["report", str(tmp_path), "--quiet"]) == 0
    assert top.main(["compare", str(tmp_path), str(tmp_path)]) == 0
    assert "# Compare A" in capsys.readouterr().out


# ---------------------------------------------------------------- compare
def test_compare_puts_two_benchmarks_side_by_side(tmp_path, capsys):
    before, after = tmp_path / "a100", tmp_path / "h100"
    synthetic_doc().save(before)
    faster = synthetic()
    faster["benchmark"] = "demo-h100"
    for run in faster["runs"]:
        run["name"] = run["name"].replace("demo-", "demo-h100-")
    faster["runs"][0]["results"] = {**DDP_RESULTS, "tokensPerSecond": 24691.356, "peakMemoryBytes": 786_432_000}
    faster["runs"] = faster["runs"][:1] + [entry("demo-h100-fsdp-bf16-2x4g", "fsdp", "bf16", nodes=2, procs=4, gpus=4,
                                                 results=DDP_RESULTS)]
    ResultsDocument.read(faster).save(after)
    assert compare.main([str(before), str(after), "--output", str(tmp_path / "cmp.md")]) == 0
    out = capsys.readouterr().out
    assert out == (tmp_path / "cmp.md").read_text()
    assert f"benchmark `demo`, phase PartiallySucceeded, on {H100}" in out
    # matched by strategy, precision and scale, whatever the run names: tokens/s doubled, memory halved
    assert "| ddp-bf16 | 2×4 GPU | 12,346 | 24,691 | 2.00 | 1,543 | 1,543 | 1.00 | 1,500.0 | 750.0 | 0.50 |" in out
    assert "| not decided: a comparison needs 3 rounds or more (fewer cannot tell its noise) |" in out
    assert "Only in A: single-fp32 1×1 GPU, horovod-fp16 2×4 GPU." in out
    assert "Only in B: fsdp-bf16 2×4 GPU." in out
    assert ("| 2×4 GPU | fastest | ddp bf16 is the only configuration measured: 12,346 tokens/s | not decided: a "
            "comparison needs 3 rounds or more") in out
    assert "| FSDP's per-rank memory is below DDP's |" in out


def test_compare_with_a_missing_or_invalid_folder_exits_2_with_one_line(tmp_path, capsys):
    synthetic_doc().save(tmp_path / "good")
    assert compare.main([str(tmp_path / "good"), str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err == f"gpt2bench compare: B: {tmp_path / 'missing' / 'results.json'} does not exist\n"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("[1, 2")
    assert compare.main([str(tmp_path / "bad"), str(tmp_path / "good")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpt2bench compare: A: ") and "is not valid JSON" in err and err.count("\n") == 1


# ---------------------------------------------------------------- a cluster
@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    from kube import EmulatedCluster
    from kube.fixtures import CRD

    with EmulatedCluster(tmp_path_factory.mktemp("kube")) as cluster:
        cluster.kubectl("apply", "-f", str(CRD))
        cluster.kubectl("create", "namespace", "team-a")
        yield cluster


@pytest.fixture
def kubeconfig_in_team_a(emulated, tmp_path, monkeypatch):
    """The emulator's kubeconfig with the context's namespace set to team-a."""
    config = yaml.safe_load(emulated.kubeconfig.read_text())
    config["contexts"][0]["context"]["namespace"] = "team-a"
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    return emulated


def test_cluster_report_reads_the_resource_status(kubeconfig_in_team_a, tmp_path, capsys):
    from kube.fixtures import api_client

    doc = synthetic()
    resource = {"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark",
                "metadata": {"name": "demo", "namespace": "team-a"},
                "spec": {**copy.deepcopy(doc["spec"]),
                         "sweep": {"strategies": [{"name": n} for n in sorted({r["strategy"] for r in doc["runs"]})]}}}
    objects = kubernetes.client.CustomObjectsApi(api_client(kubeconfig_in_team_a))
    objects.create_namespaced_custom_object("gpt2bench.io", "v1alpha1", "team-a", "gpt2benchmarks", resource)
    status = {k: doc[k] for k in ("runs", "phase", "best", "startTime", "completionTime")}
    objects.patch_namespaced_custom_object_status("gpt2bench.io", "v1alpha1", "team-a", "gpt2benchmarks", "demo",
                                                  {"status": status})
    out = tmp_path / "report"
    # the namespace comes from the kubeconfig context when -n is not given
    assert cli.main(["--cluster", "demo", "--output", str(out)]) == 0
    saved = json.loads((out / "results.json").read_text())
    assert {k: v for k, v in saved.items() if k not in ("analysis", "spec")} == {k: v for k, v in doc.items()
                                                                                 if k != "spec"}
    assert saved["spec"] == resource["spec"]
    assert saved["analysis"]["recommended"]["run"] == "demo-ddp-bf16-2x4g"
    assert table.results_table_markdown(ResultsDocument.read(doc)) in (out / "results.md").read_text()
    for png in ("throughput.png", "peak_memory.png", "train_time.png", "grad_norm.png"):
        assert_png(out / png)
    assert not (out / "loss.png").exists()  # no steps ConfigMaps here (tests/test_operator_cluster.py has them)


def test_cluster_report_says_when_the_benchmark_is_missing(kubeconfig_in_team_a, tmp_path, capsys):
    assert cli.main(["--cluster", "absent", "-n", "other", "--output", str(tmp_path / "r")]) == 1
    assert "GPT2Benchmark other/absent: not found" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_results_md_says_the_fastest_is_among_the_candidates_and_how_many_rounds_would_decide(tmp_path):
    runs = []
    for strategy, values in (("ddp", (95.0, 105.0, 100.0)), ("fsdp", (99.0, 104.0, 106.0))):
        for k, tps in enumerate(values, start=1):
            results = {**DDP_RESULTS, "tokensPerSecond": tps}
            runs.append(entry(f"demo-{strategy}-bf16-1x2g-r{k}", strategy, "bf16", gpus=2, results=results)
                        | {"repeat": k})
    doc = synthetic_doc(runs=runs)
    report.write_report(doc, tmp_path)
    markdown = (tmp_path / "results.md").read_text()
    rec = doc.analysis.recommended
    assert rec.decision == "no-clear-winner" and rec.confidence == 0.95 and rec.margin_low < 0 < rec.margin_high
    z = [math.log(b / a) for a, b in zip((95.0, 105.0, 100.0), (99.0, 104.0, 106.0))]  # within rounds
    assert rec.margin == pytest.approx(math.exp(sum(z) / 3) - 1)
    assert rec.round_seconds == 120.0  # one more round: both configurations' runs, 60 s each in this document
    verdict = "not separated after 3 rounds: the fastest is among fsdp bf16, ddp bf16 (error rate ≤ 5 %); "
    assert rec.verdict.startswith(verdict)
    if rec.rounds_needed is None:
        assert "no number of rounds up to 50 would likely decide it" in rec.verdict
    else:
        more = rec.rounds_needed - 3
        assert f"about {more} more round" in rec.verdict and f"sweep.maxRepeats {rec.rounds_needed}" in rec.verdict
    assert f"**At the largest scale measured (1×2 GPU): {rec.verdict}**" in markdown
    assert "| tokensPerSecond | 1×2 GPU | ±" in markdown  # the noise section, per scale
    assert '"(error rate ≤ 5 %)": each scale\'s race names' in markdown  # the error rate, explained once
    assert "assuming each configuration's runs vary normally around one speed" in markdown  # and what it assumes


def test_compare_applies_the_noise_rule():
    from gpt2bench.report.noise import Interval

    assert compare.beyond_noise(Interval(1.03, 0.95, 1.11, 0.95)) == "no (within the noise)"
    assert compare.beyond_noise(Interval(1.10, 1.04, 1.16, 0.95)) == "yes: B higher"
    assert compare.beyond_noise(Interval(0.90, 0.85, 0.95, 0.95)) == "yes: B lower"
    assert compare.beyond_noise(None).startswith("not decided: a comparison needs 3 rounds")


def test_the_breakdown_section_and_plot_split_each_configurations_step(tmp_path):
    parts = {"dataSecondsMean": 0.001, "forwardSecondsMean": 0.004, "backwardSecondsMean": 0.006,
             "optimizerSecondsMean": 0.002, "otherSecondsMean": 0.0005, "commSecondsMean": 0.005,
             "commExposedSecondsMean": 0.0015, "commHiddenRatio": 0.7, "commBytesPerStep": 2 * 2**20,
             "energyJoulesPerMillionTokens": 850.0}
    runs = [entry("demo-ddp-bf16-1x2g", "ddp", "bf16", gpus=2, results={**DDP_RESULTS, **parts}),
            entry("demo-single-bf16-1x1g", "single", "bf16", procs=1, gpus=1, results=SINGLE_RESULTS)]
    written = [p.name for p in report.write_report(synthetic_doc(runs=runs), tmp_path)]
    markdown = (tmp_path / "results.md").read_text()
    # ms: data 1.0, forward 4.0, backward 6.0, optimizer 2.0, other 0.5, exposed 1.5; comm 5.0, 70 % hidden
    assert ("| demo-ddp-bf16-1x2g | 1×2 GPU | 1.0 | 4.0 | 6.0 | 2.0 | 0.5 | 1.5 | 5.0 | 70% | 2.0 | 850 |"
            in markdown)
    assert "demo-single-bf16-1x1g | 1×1 GPU" not in markdown.split("## Where the step time goes")[1].split("##")[0]
    assert "breakdown.png" in written
    assert_png(tmp_path / "breakdown.png")
    with open(tmp_path / RESULTS_CSV, newline="") as f:
        rows = {r["name"]: r for r in csv.DictReader(f)}
    assert float(rows["demo-ddp-bf16-1x2g"]["commExposedSecondsMean"]) == 0.0015
    assert rows["demo-single-bf16-1x1g"]["commExposedSecondsMean"] == ""


def test_the_cost_and_energy_table_prices_each_configuration_and_converts_its_energy(tmp_path):
    spec = {**synthetic()["spec"], "cost": {"gpuHour": 2.0, "nodeHour": 0.5, "currency": "EUR"}}
    energy = {"energyJoulesPerMillionTokens": 850.0, "energySource": "nvml"}
    runs = [entry("demo-ddp-bf16-1x2g", "ddp", "bf16", gpus=2, results={**DDP_RESULTS, **energy}),
            entry("demo-single-bf16-1x1g", "single", "bf16", procs=1, gpus=1, results=SINGLE_RESULTS)]
    report.write_report(synthetic_doc(runs=runs, spec=spec), tmp_path)
    section = (tmp_path / "results.md").read_text().split("## Cost and energy")[1].split("\n## ")[0]
    # ddp: 2 GPUs × 2.0 + 1 pod × 0.5 = 4.5 EUR/h; 4.5 / (12,345.678 tokens/s × 3600 s) × 10⁶ = 0.1013 EUR;
    # 850 J = 850 / 3600 Wh = 0.24 Wh. single: 1 × 2.0 + 0.5 = 2.5 EUR/h; 2.5 / (999.4 × 3600) × 10⁶ = 0.6949.
    assert "| configuration | scale | EUR per hour | EUR per 1M tokens | J per 1M tokens | Wh per 1M tokens |" in section
    assert "| demo-ddp-bf16-1x2g | 1×2 GPU | 4.50 | 0.1013 | 850 | 0.24 | nvml |" in section
    assert "| demo-single-bf16-1x1g | 1×1 GPU | 2.50 | 0.6949 | — | — | — |" in section


def test_without_prices_or_energy_the_cost_section_says_why():
    from gpt2bench.report.markdown import cost_markdown

    results = {**SINGLE_RESULTS, "energyUnavailableReason": "not measurable: no readable RAPL counter"}
    doc = synthetic_doc(runs=[entry("demo-single-fp32-1x1", "single", "fp32", procs=1, results=results)])
    assert cost_markdown(doc) == "No prices (spec.cost) and no energy figure (no readable RAPL counter).\n"


def test_the_network_table_sets_achieved_bus_bandwidth_beside_the_probe(tmp_path):
    bus = {"busKind": "allreduce", "busBandwidthAchieved": 3.0e9, "busBandwidthProbed": 12.0e9,
           "busBandwidthShare": 0.25}
    runs = [entry("demo-ddp-bf16-1x2g", "ddp", "bf16", gpus=2, results={**DDP_RESULTS, **bus}),
            entry("demo-single-bf16-1x1g", "single", "bf16", procs=1, gpus=1, results=SINGLE_RESULTS)]
    report.write_report(synthetic_doc(runs=runs), tmp_path)
    section = (tmp_path / "results.md").read_text().split("## Communication against the network")[1].split("\n## ")[0]
    assert "| demo-ddp-bf16-1x2g | 1×2 GPU | allreduce | 3.000 | 12.000 | 25% | — | — |" in section
    assert "demo-single" not in section  # no communication, no row
    with open(tmp_path / RESULTS_CSV, newline="") as f:
        rows = {r["name"]: r for r in csv.DictReader(f)}
    assert float(rows["demo-ddp-bf16-1x2g"]["busBandwidthShare"]) == 0.25


def test_the_transport_stands_beside_the_bus_bandwidth_and_runs_off_their_fabric_are_warned_about(tmp_path):
    """What carried the traffic (trainer/fabric.py): a 2-node run over InfiniBand; one whose pods shared a node;
    one whose NCCL went over sockets. The last two say so."""
    bus = {"busKind": "allreduce", "busBandwidthAchieved": 40.0e9, "busBandwidthProbed": 45.0e9,
           "busBandwidthShare": 0.9}
    runs = [entry("demo-ddp-bf16-2x4g", "ddp", "bf16", nodes=2, procs=4, gpus=4,
                  results={**DDP_RESULTS, **bus, "transport": "NET/IB", "nodesUsed": 2}),
            entry("demo-fsdp-bf16-2x4g", "fsdp", "bf16", nodes=2, procs=4, gpus=4,
                  results={**DDP_RESULTS, **bus, "transport": "P2P", "nodesUsed": 1}),
            entry("demo-horovod-bf16-2x4g", "horovod", "bf16", nodes=2, procs=4, gpus=4,
                  results={**DDP_RESULTS, **bus, "transport": "NET/Socket", "nodesUsed": 2})]
    report.write_report(synthetic_doc(runs=runs), tmp_path)
    section = (tmp_path / "results.md").read_text().split("## Communication against the network")[1].split("\n## ")[0]
    assert "| demo-ddp-bf16-2x4g | 2×4 GPU | allreduce | 40.000 | 45.000 | 90% | NET/IB | 2 |" in section
    warnings = [line for line in section.splitlines() if line.startswith("- **")]
    assert warnings == [
        "- **demo-fsdp-bf16-2x4g: a 2-node run that ran on 1 node(s): its pods shared a machine, so it is no "
        "2-node figure**",
        "- **demo-horovod-bf16-2x4g: NCCL's traffic between nodes went over sockets (NET/Socket), not the "
        "cluster's fabric (docs/clusters.md)**"]


def test_without_communication_the_network_table_says_why():
    from gpt2bench.report.markdown import network_markdown

    doc = synthetic_doc(runs=[entry("demo-single-fp32-1x1", "single", "fp32", procs=1, results=SINGLE_RESULTS)])
    assert network_markdown(doc).startswith("No run measured its communication")


def test_the_report_of_ten_quiet_and_two_noisy_configurations_keeps_its_false_winner_rate(tmp_path):
    """Unequal noise through `gpt2bench report` on a results.json: 10 configurations at 2 % noise, 2 at 10 %, equal
    true means, 3 rounds. The report read back from the file names a false fastest winner in at most 5 % of seeded
    sweeps (13 % with the pooled noise and the runner-up alone of two rounds ago)."""
    import math
    import random

    from gpt2bench.report.analysis import analyze
    from gpt2bench.status import ResultsDocument

    strategies = ["ddp", "fsdp", "horovod", "ps", "ps-sharded", "single"]
    rng = random.Random(29)

    def sweep_document() -> dict:
        runs = []
        for i in range(12):
            strategy, precision = strategies[i % 6], ("fp32", "bf16")[i // 6]
            sigma = 0.10 if i >= 10 else 0.02
            for k in (1, 2, 3):
                results = {**DDP_RESULTS, "tokensPerSecond": 100 * math.exp(rng.gauss(0, sigma))}
                runs.append(entry(f"q-{strategy}-{precision}-1x2g-r{k}", strategy, precision, gpus=2, results=results)
                            | {"repeat": k})
        return synthetic(runs=runs)

    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(sweep_document()))
    assert cli.main([str(folder), "--quiet"]) == 0  # the whole report, once
    assert "## Noise" in (folder / "results.md").read_text()
    trials, false_winners = 300, 0
    for _ in range(trials):  # the rest through the same reading of results.json and the same analysis
        doc = ResultsDocument.read(json.loads(json.dumps(sweep_document())))
        false_winners += analyze(doc.runs, doc.spec, rounds_needed=False).recommended.winner is not None
    assert false_winners / trials <= 0.05


def test_the_step_breakdown_and_the_network_come_from_the_breakdown_round_and_decide_nothing(tmp_path):
    """sweep.breakdown separate: the `-prof` run timed the breakdown (and the collectives probe); the decision
    rounds did not. The breakdown and network tables are the breakdown round's; tokens/s decisions use the rounds
    alone (the profile run's slower 500 tokens/s is in no mean)."""
    breakdown = {"dataSecondsMean": 0.001, "forwardSecondsMean": 0.05, "backwardSecondsMean": 0.1,
                 "optimizerSecondsMean": 0.02, "otherSecondsMean": 0.001, "commSecondsMean": 0.04,
                 "commExposedSecondsMean": 0.01, "commHiddenRatio": 0.75, "commBytesPerStep": 27867136,
                 "busKind": "allreduce", "busBandwidthAchieved": 3.0e9, "busBandwidthProbed": 4.0e9,
                 "busBandwidthShare": 0.75}
    runs = [entry("b-ddp-fp32-1x2g-prof", "ddp", "fp32", gpus=2, results={**DDP_RESULTS, **breakdown,
                                                                          "tokensPerSecond": 500.0}) | {"profile": True}]
    runs += [entry(f"b-ddp-fp32-1x2g-r{k}", "ddp", "fp32", gpus=2, results={**DDP_RESULTS, "tokensPerSecond": tps})
             | {"repeat": k} for k, tps in ((1, 1000.0), (2, 1010.0))]
    doc = synthetic_doc(runs=runs)
    report.write_report(doc, tmp_path)
    markdown = (tmp_path / "results.md").read_text()
    assert "| b-ddp-fp32-1x2g | 1×2 GPU | 1.0 | 50.0 | 100.0 | 20.0 | 1.0 | 10.0 | 40.0 | 75% |" in markdown
    assert "| b-ddp-fp32-1x2g | 1×2 GPU | allreduce | 3.000 | 4.000 | 75% |" in markdown
    assert doc.analysis.recommended.value == pytest.approx((1000.0 * 1010.0) ** 0.5)  # the rounds only
