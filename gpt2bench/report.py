"""`gpt2bench report`: the comparison table and the papers' figures from a results document.

A results document is what `gpt2bench run` writes to `DIR/results.json`, or what the operator keeps in a
GPT2Benchmark's status: `{benchmark, namespace, spec, runs: [results entries], phase, best, startTime,
completionTime}` (entries as in docs/design.md; local entries add `stepsFile`, a path relative to DIR).

    gpt2bench report DIR                                # rebuild DIR/results.md and DIR/*.png
    gpt2bench report --cluster NAME [-n NS] [--output DIR]   # the same from a cluster's GPT2Benchmark

Per-step curves (loss, grad norm) come from the runs' steps.jsonl: a local run keeps the trainer's file, and
on a cluster the operator keeps each run's curves in a ConfigMap `<run>-steps` (from the result pod's log),
which `--cluster` writes to DIR/steps/<run>.jsonl.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from gpt2bench.files import write_atomic
from gpt2bench.status import RESULTS_JSON, ResultsDocument

RESULTS_MD = "results.md"
NO_VALUE = "—"
_MIB = 2**20


def write_results_json(doc: dict[str, Any], directory: str | os.PathLike) -> Path:
    return ResultsDocument.read(doc).save(directory)


# ---------------------------------------------------------------- table


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) or math.isinf(value) else float(value)


def _fmt(value: Any, spec: str, scale: float = 1.0) -> str:
    number = _number(value)
    return NO_VALUE if number is None else format(number * scale, spec)


def scale_label(entry: dict[str, Any]) -> str:
    """`1×2 CPU` / `2×4 GPU`: nodes × training processes per node, and the device kind."""
    nodes = entry.get("nodes", "?")
    procs = entry.get("processesPerNode", "?")
    devices = entry.get("devicesPerNode") or 0
    return f"{nodes}×{procs} {'GPU' if devices else 'CPU'}"


def status_label(entry: dict[str, Any]) -> str:
    phase = entry.get("phase") or "Unknown"
    reason = " ".join(str(entry.get("reason") or "").split())
    if phase == "Succeeded" or not reason:
        return phase
    if len(reason) > 160:
        reason = reason[:157] + "..."
    return f"{phase}: {reason}"


# (header, cell function): the run columns read the entry, the figure columns its `results`.
COLUMNS: list[tuple[str, Any]] = [
    ("run", lambda e: e.get("name", NO_VALUE)),
    ("strategy", lambda e: e.get("strategy", NO_VALUE)),
    ("precision", lambda e: e.get("precision", NO_VALUE)),
    ("scale", scale_label),
    ("tokens/s", lambda r: _fmt(r.get("tokensPerSecond"), ",.0f")),
    ("per device", lambda r: _fmt(r.get("tokensPerSecondPerDevice"), ",.0f")),
    (
        "step p50 / p95 (ms)",
        lambda r: f"{_fmt(r.get('stepTimeP50Seconds'), '.1f', 1e3)} / {_fmt(r.get('stepTimeP95Seconds'), '.1f', 1e3)}",
    ),
    ("peak mem (MiB)", lambda r: _fmt(r.get("peakMemoryBytes"), ",.1f", 1 / _MIB)),
    ("train s", lambda r: _fmt(r.get("trainSeconds"), ".1f")),
    ("final loss", lambda r: _fmt(r.get("finalLoss"), ".4f")),
    ("grad norm", lambda r: _fmt(r.get("gradNorm"), ".3f")),
    ("status", status_label),
]
_ENTRY_COLUMNS = {"run", "strategy", "precision", "scale", "status"}


def table_rows(doc: dict[str, Any]) -> list[list[str]]:
    """One row of cell texts per run, in the document's order."""
    rows = []
    for entry in doc.get("runs") or []:
        results = entry.get("results") or {}
        rows.append([str(cell(entry if header in _ENTRY_COLUMNS else results)) for header, cell in COLUMNS])
    return rows


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def results_table_markdown(doc: dict[str, Any]) -> str:
    """The comparison table as GitHub markdown, one row per run (failed runs included, with reasons)."""
    headers = [header for header, _ in COLUMNS]
    numeric = {"tokens/s", "per device", "step p50 / p95 (ms)", "peak mem (MiB)", "train s", "final loss", "grad norm"}
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---:" if h in numeric else "---" for h in headers) + "|",
    ]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table_rows(doc)]
    return "\n".join(lines) + "\n"


def best_run_name(doc: dict[str, Any]) -> str | None:
    best = doc.get("best")
    if isinstance(best, dict):
        return best.get("name") or best.get("run")
    if isinstance(best, str):
        return best
    return None


def _spec_line(spec: dict[str, Any]) -> str:
    model = spec.get("model") or {}
    training = spec.get("training") or {}
    parts = [f"model `{model.get('preset', 'tiny')}`"]
    for key, label in (
        ("seqLen", "seq"),
        ("microBatchSize", "micro-batch"),
        ("gradAccum", "grad-accum"),
        ("steps", "steps"),
        ("warmupSteps", "warm-up steps"),
    ):
        if key in training:
            parts.append(f"{label} {training[key]}")
    return ", ".join(parts)


def results_markdown(doc: dict[str, Any], plots: list[str], notes: list[str]) -> str:
    runs = doc.get("runs") or []
    devices = {bool(r.get("devicesPerNode")) for r in runs}
    kind = "GPU figures" if devices == {True} else "CPU figures" if devices == {False} else "CPU and GPU figures"
    title = f"# GPT2Benchmark `{doc.get('benchmark', '?')}`: results ({kind})"
    lines = [title, ""]
    meta = [f"phase **{doc.get('phase', 'Unknown')}**"]
    if doc.get("namespace"):
        meta.append(f"namespace `{doc['namespace']}`")
    if doc.get("startTime"):
        meta.append(f"started {doc['startTime']}")
    if doc.get("completionTime"):
        meta.append(f"finished {doc['completionTime']}")
    lines += ["; ".join(meta) + ".", ""]
    if doc.get("spec"):
        lines += [_spec_line(doc["spec"]) + ".", ""]
    lines.append(results_table_markdown(doc))
    best = best_run_name(doc)
    if best:
        lines += [f"Highest throughput: **{best}**.", ""]
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.get("phase", "Unknown")] = counts.get(run.get("phase", "Unknown"), 0) + 1
    lines += [", ".join(f"{n} {phase}" for phase, n in counts.items()) + f" of {len(runs)} runs.", ""]
    lines += [
        (
            "Metric definitions: see docs/metrics.md (tokens/s excludes warm-up steps; "
            "peak memory is the largest across ranks)."
        ),
        "",
    ]
    for plot in plots:
        lines += [f"![{Path(plot).stem}]({plot})", ""]
    lines += [f"_{note}_\n" for note in notes]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------- plots


def _bar_chart(path: Path, names: list[str], values: list[float], colors: list[str], xlabel: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    height = max(2.5, 0.45 * len(names) + 1.2)
    fig, ax = plt.subplots(figsize=(8, height))
    bars = ax.barh(names, values, color=colors)
    ax.invert_yaxis()  # first run on top, as in the table
    ax.bar_label(bars, labels=[f"{v:,.1f}" if v < 100 else f"{v:,.0f}" for v in values], padding=3, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.margins(x=0.15)
    fig.tight_layout()
    _save(fig, path)


def _line_chart(path: Path, curves: dict[str, tuple[list[int], list[float]]], ylabel: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4.5))
    styles = ["-", "--", "-.", ":"]
    for i, (name, (steps, values)) in enumerate(curves.items()):
        # synchronous strategies trace the same curve: vary the dashes so that none hides another
        ax.plot(
            steps,
            values,
            label=name,
            linewidth=1.4,
            linestyle=styles[i % len(styles)],
            marker="o" if len(steps) < 30 else None,
            markersize=3,
        )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    _save(fig, path)


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, format="png", dpi=110)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)


BAR_PLOTS = [
    # file, results key, scale, x label, title
    ("throughput.png", "tokensPerSecond", 1.0, "tokens / s (whole job)", "Training throughput"),
    ("peak_memory.png", "peakMemoryBytes", 1 / _MIB, "peak memory (MiB, largest rank)", "Peak memory"),
    ("train_time.png", "trainSeconds", 1.0, "training time (s)", "Training time"),
]
# file, keys a step record may carry (trainer's steps.jsonl), y label, title
LINE_PLOTS = [
    ("loss.png", ("loss",), "training loss", "Loss per step"),
    ("grad_norm.png", ("gradNorm", "grad_norm"), "gradient norm (before clipping)", "Gradient norm per step"),
]


def read_steps_line(line: str | bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


def read_steps(path: Path) -> list[dict[str, Any]]:
    """Step records from a steps.jsonl; a torn last line (run killed mid-write) is skipped."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [record for record in map(read_steps_line, f) if record is not None]
    except OSError:
        return []


def _curve(records: list[dict[str, Any]], keys: tuple[str, ...]) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for record in records:
        value = next((_number(record.get(k)) for k in keys if _number(record.get(k)) is not None), None)
        if value is not None and isinstance(record.get("step"), int):
            steps.append(record["step"])
            values.append(value)
    return steps, values


def write_plots(doc: dict[str, Any], directory: Path) -> tuple[list[str], list[str]]:
    """Write the PNGs; return (file names written, notes on plots that could not be drawn)."""
    written, notes = [], []
    runs = [r for r in doc.get("runs") or [] if r.get("phase") == "Succeeded"]
    palette = {name: f"C{i}" for i, name in enumerate(dict.fromkeys(r.get("strategy") for r in runs))}
    for filename, key, scale, xlabel, title in BAR_PLOTS:
        points = [(r, _number((r.get("results") or {}).get(key))) for r in runs]
        points = [(r, value * scale) for r, value in points if value is not None]
        if points:
            _bar_chart(
                directory / filename,
                [r["name"] for r, _ in points],
                [v for _, v in points],
                [palette[r.get("strategy")] for r, _ in points],
                xlabel,
                title + " (colour: strategy)",
            )
            written.append(filename)
        else:
            notes.append(f"No {title.lower()} plot: no succeeded run reports {key}.")
    records = {
        r["name"] + ("" if r.get("phase") == "Succeeded" else f" ({r.get('phase')})"): read_steps(
            directory / r["stepsFile"]
        )
        for r in doc.get("runs") or []
        if r.get("stepsFile")
    }
    local = any(r.get("runDir") for r in doc.get("runs") or [])
    for filename, keys, ylabel, title in LINE_PLOTS:
        curves = {name: _curve(recs, keys) for name, recs in records.items()}
        curves = {name: curve for name, curve in curves.items() if curve[0]}
        if curves:
            _line_chart(directory / filename, curves, ylabel, title)
            written.append(filename)
        elif local:
            notes.append(f"No {title.lower()} curves: no run wrote a steps.jsonl.")
        elif not records:
            notes.append(
                f"No {title.lower()} curves: per-step records (steps.jsonl) are not part of this "
                "results document (a cluster's status keeps summaries only; see the trainer's "
                "Prometheus metrics for per-step values)."
            )
        else:
            notes.append(f"No {title.lower()} curves: the runs' steps.jsonl files have no such records.")
    return written, notes


def write_report(doc: dict[str, Any], directory: str | os.PathLike) -> list[Path]:
    """Write results.md and the PNG plots for `doc` into `directory`; return the paths written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    plots, notes = write_plots(doc, directory)
    for stale in {p[0] for p in BAR_PLOTS + LINE_PLOTS} - set(plots):  # from an earlier report of DIR
        (directory / stale).unlink(missing_ok=True)
    write_atomic(directory / RESULTS_MD, results_markdown(doc, plots, notes))
    return [directory / RESULTS_MD] + [directory / p for p in plots]


def print_table(doc: dict[str, Any], console: Any = None) -> None:
    """The table on the terminal (rich), same cells as results.md; plain markdown when not a terminal
    (logs, CI) or when the terminal is too narrow, where a rich table would squeeze every cell."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"GPT2Benchmark {doc.get('benchmark', '?')} ({doc.get('phase', 'Unknown')})")
    for header, _ in COLUMNS:
        if header == "status":
            table.add_column(header, overflow="fold", max_width=60)
        else:
            table.add_column(header, justify="left" if header in _ENTRY_COLUMNS else "right", no_wrap=True)
    best = best_run_name(doc)
    rows = table_rows(doc)
    for row in rows:
        table.add_row(*row, style="bold green" if row[0] == best else None)
    widths = [max([len(header)] + [len(row[i]) for row in rows]) for i, (header, _) in enumerate(COLUMNS)]
    widths[-1] = min(widths[-1], 60)  # long reasons fold inside the status column
    if console.is_terminal and sum(widths) + 3 * len(widths) + 1 <= console.width:
        console.print(table)
    else:  # a log, or a terminal too narrow for every column: the markdown rows, unwrapped
        console.print(results_table_markdown(doc), markup=False, highlight=False, soft_wrap=True, end="")


# ---------------------------------------------------------------- cluster


def results_doc_from_resource(resource: dict[str, Any]) -> dict[str, Any]:
    """A GPT2Benchmark object (as the API returns it) -> a results document."""
    metadata = resource.get("metadata") or {}
    status = resource.get("status") or {}
    runs = status.get("runs") or []
    return {
        "benchmark": metadata.get("name"),
        "namespace": metadata.get("namespace"),
        "spec": resource.get("spec") or {},
        "runs": runs,
        "phase": status.get("phase", "Unknown"),
        "best": status.get("best"),
        "startTime": status.get("startTime"),
        "completionTime": status.get("completionTime"),
    }


class ClusterReadError(RuntimeError):
    """The GPT2Benchmark could not be read; the message says which one and why."""


def fetch_cluster_doc(name: str, namespace: str | None, context: str | None = None) -> dict[str, Any]:
    """Read a GPT2Benchmark through the kubernetes client (kubeconfig, else in-cluster config)."""
    import urllib3
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    from gpt2bench.spec import API_GROUP, API_VERSION, PLURAL

    kubeconfig = os.environ.get("KUBECONFIG")  # the client reads it at import time; read it now, as kubectl does
    try:
        config.load_kube_config(config_file=kubeconfig, context=context)
        if namespace is None:
            _, active = config.list_kube_config_contexts(config_file=kubeconfig)
            namespace = ((active or {}).get("context") or {}).get("namespace")
    except (ConfigException, FileNotFoundError, TypeError) as exc:
        try:
            config.load_incluster_config()
        except ConfigException:
            raise ClusterReadError(f"no kubeconfig ({exc}) and not running in a cluster") from None
    namespace = namespace or "default"
    try:
        resource = client.CustomObjectsApi().get_namespaced_custom_object(
            API_GROUP, API_VERSION, namespace, PLURAL, name
        )
    except ApiException as exc:
        detail = "not found" if exc.status == 404 else f"API error {exc.status} {exc.reason}"
        raise ClusterReadError(f"GPT2Benchmark {namespace}/{name}: {detail}") from None
    except (OSError, urllib3.exceptions.HTTPError) as exc:  # connection refused, TLS, DNS ...
        raise ClusterReadError(f"cannot reach the cluster: {exc}") from None
    doc = results_doc_from_resource(resource)
    doc["stepsText"] = fetch_cluster_steps(client.CoreV1Api(), resource)
    return doc


def fetch_cluster_steps(core: Any, resource: dict[str, Any]) -> dict[str, str]:
    """Run name -> steps.jsonl text, from the ConfigMaps the operator keeps for the benchmark (its own only:
    owned by this uid). Nothing when they cannot be read: the report then says the curves are missing."""
    from kubernetes.client.exceptions import ApiException

    from gpt2bench.protocol import (
        BENCHMARK_LABEL,
        COMPONENT_LABEL,
        RUN_LABEL,
        STEPS_COMPONENT,
        STEPS_CONFIGMAP_KEY,
    )
    from gpt2bench.render import label_value

    metadata = resource.get("metadata") or {}
    selector = f"{BENCHMARK_LABEL}={label_value(metadata.get('name', ''))},{COMPONENT_LABEL}={STEPS_COMPONENT}"
    try:
        listed = core.list_namespaced_config_map(metadata.get("namespace") or "default", label_selector=selector,
                                                 _preload_content=False)
    except ApiException:
        return {}
    found = {}
    for item in json.loads(listed.data).get("items", []):
        owners = (item.get("metadata") or {}).get("ownerReferences") or []
        run = ((item.get("metadata") or {}).get("labels") or {}).get(RUN_LABEL)
        if run and any(o.get("uid") == metadata.get("uid") for o in owners):
            found[run] = (item.get("data") or {}).get(STEPS_CONFIGMAP_KEY) or ""
    return found


def write_cluster_steps(doc: dict[str, Any], directory: Path) -> None:
    """DIR/steps/<run>.jsonl for the runs whose curves the cluster kept; their entries name the file."""
    texts = doc.pop("stepsText", None) or {}
    for run in doc.get("runs") or []:
        if texts.get(run.get("name")):
            path = Path("steps") / f"{run['name']}.jsonl"
            (directory / path).parent.mkdir(parents=True, exist_ok=True)
            (directory / path).write_text(texts[run["name"]], encoding="utf-8")
            run["stepsFile"] = str(path)


# ---------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpt2bench report",
        description="Rebuild results.md and the PNG plots from DIR/results.json, or from a GPT2Benchmark's "
        "status in a cluster (--cluster NAME).",
    )
    parser.add_argument("dir", nargs="?", help="a folder written by `gpt2bench run` (holds results.json)")
    parser.add_argument("--cluster", metavar="NAME", help="read the GPT2Benchmark NAME from the cluster instead")
    parser.add_argument("-n", "--namespace", help="namespace of --cluster NAME (default: kubeconfig's, else default)")
    parser.add_argument("--context", help="kubeconfig context for --cluster")
    parser.add_argument("--output", "-o", help="where --cluster writes the report (default: results/NAME-cluster)")
    parser.add_argument("--quiet", "-q", action="store_true", help="do not print the table")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.dir) == bool(args.cluster):
        parser.print_usage(sys.stderr)
        print("gpt2bench report: give either DIR or --cluster NAME (not both)", file=sys.stderr)
        return 2
    if args.cluster:
        try:
            doc = fetch_cluster_doc(args.cluster, args.namespace, args.context)
        except ClusterReadError as exc:
            print(f"gpt2bench report: --cluster: {exc}", file=sys.stderr)
            return 1
        directory = Path(args.output or Path("results") / f"{args.cluster}-cluster")
        write_cluster_steps(doc, directory)
        write_results_json(doc, directory)
    else:
        if args.output:
            print("gpt2bench report: --output applies to --cluster only (DIR is rebuilt in place)", file=sys.stderr)
            return 2
        directory = Path(args.dir)
        try:
            doc = json.loads((directory / RESULTS_JSON).read_text(encoding="utf-8"))
        except FileNotFoundError:
            print(f"gpt2bench report: DIR: {directory / RESULTS_JSON} does not exist", file=sys.stderr)
            return 2
        except json.JSONDecodeError as exc:
            print(f"gpt2bench report: DIR: {directory / RESULTS_JSON} is not valid JSON: {exc}", file=sys.stderr)
            return 2
        if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
            print(f"gpt2bench report: DIR: {directory / RESULTS_JSON} has no `runs` list", file=sys.stderr)
            return 2
    written = write_report(doc, directory)
    if not args.quiet:
        print_table(doc)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
