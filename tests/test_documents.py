"""File-level safety: whatever a file holds, `render` and `run` exit 2 with one line per problem naming the
file (and the field where there is one): no traceback, no hang, no unbounded memory."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import TINY_N_EMBD

from gpt2bench.local import cli as run_cli
from gpt2bench.render.cli import main as render_main
from gpt2bench.specification import documents
from gpt2bench.specification.validation import SpecError, load_benchmark_file

VALID = b"apiVersion: gpt2bench.io/v1alpha1\nkind: GPT2Benchmark\nmetadata: {name: ok}\nspec:\n" \
        b"  sweep: {strategies: [{name: ddp}]}\n"


def alias_bomb(levels: int = 9) -> bytes:
    """The "billion laughs": each level nine aliases of the one before; 9 levels expand to 9**9 strings."""
    text = VALID.decode() + '  a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for level in range(1, levels):
        text += f"  a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]\n"
    return text.encode()


# (id, file content, what the one-line message says)
BAD_FILES = [
    ("empty", b"", "empty file: expected one GPT2Benchmark"),
    ("only-comments", b"# nothing here\n", "empty file"),
    ("not-utf8", b"spec: \xff\xfe\n", "not UTF-8 text: byte 0xff at offset 6"),
    ("utf16", "apiVersion: x\n".encode("utf-16"), "not UTF-8 text"),
    ("control-character", b"spec: \x00\n", "control characters are not allowed"),
    ("invalid-yaml", b"spec: [unclosed\n", "not valid YAML: line 2, column 1"),
    ("tab-indentation", b"spec:\n\tsweep: {}\n", "not valid YAML"),
    ("two-documents-one-name", VALID + b"---\n" + VALID,
     "document 2 (ok, line 7): metadata.name: 'ok' is also the name of document 1 (ok, line 1)"),
    ("bad-second-document", VALID + b"---\n" + VALID.replace(b"name: ok", b"name: two") + b"  training: {lr: x}\n",
     "document 2 (two, line 7): spec.training.lr: Input should be a valid number"),
    ("bad-yaml-in-second-document", VALID + b"---\nspec: [unclosed\n", "not valid YAML: document 2: line 8, column 1"),
    ("undefined-alias", VALID + b"  concurrency: *nowhere\n", "found undefined alias *nowhere"),
    ("recursive-alias", VALID + b"  loop: &loop [1, *loop]\n", "recursive alias"),
    ("alias-bomb", alias_bomb(), "excessive aliasing"),
    ("deep-nesting", b"spec: " + b"[" * 150 + b"]" * 150 + b"\n", "nested more than 100 levels deep"),
    # PyYAML >= 6.0.4's scanner refuses flow nesting deeper than 1,000 before our check sees the events: either
    # refusal is a one-line error naming the file
    ("deeper-than-the-yaml-scanner-allows", b"spec: " + b"[" * 5000 + b"]" * 5000 + b"\n",
     ("nested more than 100 levels deep", "exceeded maximum nesting depth")),
    ("deep-through-aliases", VALID + b"  a: &a " + b"[" * 60 + b"]" * 60 + b"\n  b: &b [" + b"*a, " * 2
     + b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[*a]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n",
     "nested more than 100 levels deep (aliases included)"),
    ("duplicate-key", VALID + b"  concurrency: 1\n  concurrency: 2\n", "line 7, column 3: spec.concurrency is given twice (lines 6 and 7)"),
    ("complex-key", b"? [a, b]\n: c\n", "a mapping key must be a plain value"),
    ("python-tag", b"spec: !!python/object/apply:os.system [echo hi]\n", "YAML tag !!python/object/apply:os.system"),
    ("local-tag", b"spec: !secret x\n", "YAML tag !secret is not allowed"),
    ("binary-tag", b"spec: !!binary aGVsbG8=\n", "YAML tag !!binary is not allowed"),
    ("bad-int-tag", b"spec: !!int abc\n", "line 1, column 7 (spec): cannot read !!str `abc` as !!int"),
    ("empty-int-tag", b"!!int ", "cannot read !!null `` as !!int"),
    ("huge-integer", b"spec: {concurrency: " + b"9" * 5000 + b"}\n",  # beyond uint64 and float64: a string in Go
     "spec.concurrency: Input should be a valid integer, got \"9999"),
    ("not-a-mapping", b"- a\n- b\n", "a GPT2Benchmark must be a YAML mapping, got a list"),
    ("scalar", b"hello\n", 'a GPT2Benchmark must be a YAML mapping, got "hello"'),
    ("too-large", b"# " + b"x" * documents.MAX_FILE_BYTES + b"\n", "larger than 3145728 bytes"),
    ("name-not-a-string", VALID.replace(b"{name: ok}", b"{name: 2024}"), "metadata.name: must be a string, got 2024"),
    ("nan", VALID + b"  training: {lr: .nan}\n", "(spec.training.lr): .nan is not a number JSON can hold"),
    ("infinity", VALID + b"  training: {maxGradNorm: -.Inf}\n", "(spec.training.maxGradNorm): -.Inf is not a number"),
    ("null-key", VALID + b"  ~: 1\n", "line 6, column 3 (spec): a mapping key cannot be null"),
    ("merge-then-same-key", VALID + b"  training: {<<: {steps: 5}, steps: 6}\n", "spec.training.steps is given twice"),
    ("list-bad-item", b"apiVersion: v1\nkind: List\nitems:\n- {apiVersion: gpt2bench.io/v1alpha1, kind: GPT2Benchmark,"
     b" metadata: {name: a}, spec: {}}\n- {apiVersion: gpt2bench.io/v1alpha1, kind: GPT2Benchmark, metadata: {name: b},"
     b" spec: {sweep: {strategies: [{name: nope}]}}}\n", "items[1].spec.sweep.strategies[0].name: Input should be"),
    ("list-items-not-a-list", b"apiVersion: v1\nkind: List\nitems: {a: 1}\n",
     "items: must be a list of objects, got a mapping"),
    ("list-empty", b"apiVersion: v1\nkind: List\nitems: []\n", "empty file: expected one GPT2Benchmark"),
    ("list-same-name-twice", b"apiVersion: v1\nkind: List\nitems:\n- " + VALID.replace(b"\n", b"\n  ")[:-2]
     + b"- " + VALID.replace(b"\n", b"\n  ")[:-2],
     "items[1].metadata.name: 'ok' is also the name of items[0]"),
]


@pytest.mark.parametrize("content, said", [pytest.param(c, s, id=i) for i, c, s in BAD_FILES])
def test_a_bad_file_is_one_line_per_problem_naming_the_file(tmp_path, content, said):
    path = tmp_path / "bench.yaml"
    path.write_bytes(content)
    started = time.monotonic()
    with pytest.raises(SpecError) as caught:
        load_benchmark_file(str(path))
    assert time.monotonic() - started < 5
    lines = caught.value.lines()
    assert lines and all("\n" not in line and line.startswith(f"{path}: ") for line in lines), lines
    assert any(words in line for words in (said if isinstance(said, tuple) else (said,)) for line in lines), lines


@pytest.mark.parametrize("content, said", [pytest.param(c, s, id=i) for i, c, s in BAD_FILES
                                           if i in ("not-utf8", "empty", "alias-bomb", "name-not-a-string")])
def test_render_and_run_exit_2_without_a_traceback(tmp_path, capsys, content, said):
    path = tmp_path / "bench.yaml"
    path.write_bytes(content)
    assert render_main([str(path)]) == 2
    assert run_cli.main([str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and said in err
    assert f"gpt2bench render: {path}: " in err and f"gpt2bench run: {path}: " in err
    assert "gpt2bench run: nothing was run" in err and not (tmp_path / "out").exists()


def test_the_issue_messages_read_well(tmp_path, capsys):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert render_main([str(empty)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"gpt2bench render: {empty}: empty file: expected one GPT2Benchmark (apiVersion, kind, metadata, " \
                  "spec)"
    assert ": : " not in err


def test_a_namespace_option_that_no_api_server_takes_exits_2(tmp_path, capsys):
    path = tmp_path / "ok.yaml"
    path.write_bytes(VALID)
    assert render_main([str(path), "-n", "Team_A"]) == 2
    assert '--namespace: "Team_A" is not a DNS-1123 label' in capsys.readouterr().err


def test_an_unreadable_path_exits_2(tmp_path, capsys):
    assert render_main([str(tmp_path)]) == 2  # a folder
    assert render_main([str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "Traceback" not in err


def test_the_cli_process_prints_no_traceback_for_an_alias_bomb(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_bytes(alias_bomb(12))
    done = subprocess.run([sys.executable, "-m", "gpt2bench", "render", str(path)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2 and "excessive aliasing" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_what_is_allowed_loads(tmp_path):
    """Aliases in moderation, merge keys, a byte-order mark, a leading '---', timestamps as strings."""
    content = ("\ufeff---\napiVersion: gpt2bench.io/v1alpha1\nkind: GPT2Benchmark\nmetadata:\n  name: fine\n"
               "  annotations: {created: 2024-01-01}\nspec:\n  sweep:\n    strategies: [{name: ddp}, {name: fsdp}]\n"
               "    scales: [&one {nodes: 1}, {<<: *one, processesPerNode: 2}]\n").encode()
    path = tmp_path / "fine.yaml"
    path.write_bytes(content)
    benchmark = load_benchmark_file(str(path))
    assert [s.procs_per_node for s in benchmark.spec.sweep.scales] == [1, 2]
    assert documents.parse_document(content)["metadata"]["annotations"] == {"created": "2024-01-01"}


def test_the_alias_limit_is_yaml_v2s():
    """A document mostly made of aliases passes below 1,000 decoded nodes or 100 aliased ones, as in yaml.v2."""
    def aliased(items: int, aliases: int) -> bytes:
        return b"a: &a [" + b", ".join([b"1"] * items) + b"]\nb: [" + b", ".join([b"*a"] * aliases) + b"]\n"

    assert len(documents.parse_document(aliased(9, 10))["b"]) == 10  # 100 aliased nodes of 115
    assert len(documents.parse_document(aliased(20, 60))["b"]) == 60  # 1,260 aliased of 1,285: 98 %
    with pytest.raises(documents.DocumentError, match="excessive aliasing"):
        documents.parse_document(aliased(20, 200))  # 4,200 aliased of 4,225: more than 99 %


def test_the_examples_are_plain_yaml():
    for example in (Path(__file__).resolve().parents[1] / "manifests" / "examples").glob("*.yaml"):
        assert isinstance(documents.parse_document(example.read_bytes()), dict)


# Plain scalars whose meaning differs between YAML 1.1, YAML 1.2 and Go: how kubectl (sigs.k8s.io/yaml, go-yaml v2)
# reads them is the reference; `expected` pins the values so that a change on either side shows.
SCALARS = {
    "lr": ("3e-4", 0.0003), "exponent": ("1e3", 1000), "signedExponent": ("1.0e+3", 1000), "dot": ("1.", 1),
    "leadingDot": ("+.5", 0.5), "octal": ("017", 15), "octalO": ("0o17", 15), "hex": ("0x1F", 31),
    "binary": ("0b101", 5), "negativeBinary": ("-0b101", -5), "underscores": ("1_000", 1000), "plus": ("+12", 12),
    "notOctal": ("09", 9), "yesValue": ("yes", True), "onValue": ("on", True), "offValue": ("off", False),
    "yValue": ("y", True), "noValue": ("No", False), "trueValue": ("TRUE", True), "sexagesimal": ("1:30", "1:30"), "date": ("2024-01-01", "2024-01-01"),
    "quotedYes": ('"yes"', "yes"), "quotedNumber": ("'3e-4'", "3e-4"), "taggedString": ("!!str 017", "017"),
    "taggedFloat": ("!!float 1", 1.0), "taggedInt": ('!!int "0x10"', 16), "word": ("ddp", "ddp"),
    "tooLarge": ("1e400", "1e400"), "hexFloat": ("0x1p-2", "0x1p-2"), "infWord": ("inf", "inf"),
}
KEYS = {"08": "8", "1e3": "1000", "1.5": "1.5", "yes": "true", "n": "false", "0x10": "16", "017": "15", "plain": "plain"}


def scalars_document(name: str = "scalars") -> str:
    lines = [f"    {field}: {text}" for field, (text, _) in SCALARS.items()]
    lines += [f"    {key}: {i}" for i, key in enumerate(KEYS)]
    return ("apiVersion: gpt2bench.io/v1alpha1\nkind: GPT2Benchmark\nmetadata:\n  name: " + name + "\nspec:\n"
            "  sweep: {strategies: [{name: ddp}]}\n  probe:\n" + "\n".join(lines) + "\n")


def kubectl_reads(cluster, text: str) -> list[dict]:
    """What `kubectl apply` would send: its client-side YAML to JSON, without the last-applied copy."""
    done = cluster.kubectl("apply", "--dry-run=client", "-o", "json", "-f", "-", input=text)
    sent = json.loads(done.stdout)
    items = sent["items"] if sent.get("kind") == "List" else [sent]
    for item in items:
        item["metadata"].pop("annotations", None)
        item["metadata"].pop("namespace", None)
    return items


def test_plain_scalars_and_keys_are_read_as_kubectl_reads_them(cluster):
    text = scalars_document()
    (local,) = documents.parse_documents(text.encode())
    (sent,) = kubectl_reads(cluster, text)
    assert local.value == sent
    probe = local.value["spec"]["probe"]
    assert {field: probe[field] for field in SCALARS} == {field: value for field, (_, value) in SCALARS.items()}
    assert all(isinstance(probe[field], bool) for field in ("yesValue", "onValue", "offValue", "yValue", "noValue", "trueValue"))
    assert [probe[key] for key in KEYS.values()] == list(range(len(KEYS)))


def test_a_stream_of_documents_is_read_as_kubectl_reads_it(cluster):
    """Every document in turn; empty ones (nothing, comments, null) skipped; positions count them all."""
    text = ("---\n# only a comment\n---\n" + scalars_document("first") + "---\nnull\n---\n"
            + scalars_document("second") + "...\n")
    local = documents.parse_documents(text.encode())
    second = text[:text.index("apiVersion", text.index("null"))].count("\n") + 1
    assert [(d.number, d.line) for d in local] == [(2, 4), (4, second)]
    assert [d.value for d in local] == kubectl_reads(cluster, text)


def test_infinity_is_refused_as_kubectl_refuses_it(cluster):
    text = scalars_document().replace("  probe:\n", "  probe:\n    big: .inf\n")
    refused = cluster.kubectl("apply", "--dry-run=client", "-o", "json", "-f", "-", input=text, check=False)
    assert refused.returncode != 0 and "unsupported value: +Inf" in refused.stderr
    with pytest.raises(documents.DocumentError, match=r"\(spec.probe.big\): .inf is not a number JSON can hold"):
        documents.parse_documents(text.encode())


def test_a_key_given_twice_is_refused_where_kubectl_would_keep_the_last(cluster):
    """YAML forbids it and the API server's strict reading refuses it; kubectl's client-side conversion keeps
    the last value silently (kubernetes/kubernetes#99286): refused here, naming the key and both lines."""
    text = VALID.decode() + "  training: {steps: 20, lr: 1e-3}\n  training:\n    steps: 30\n"
    (sent,) = kubectl_reads(cluster, text)
    assert sent["spec"]["training"] == {"steps": 30}
    with pytest.raises(documents.DocumentError) as refused:
        documents.parse_documents(text.encode())
    assert str(refused.value) == ("line 7, column 3: spec.training is given twice (lines 6 and 7): YAML forbids a "
                                  "key twice in a mapping, and the API server refuses it")
    with pytest.raises(documents.DocumentError, match=r"spec.training.steps is given twice \(lines 6 and 6\)"):
        documents.parse_documents(VALID + b"  training: {steps: 1, steps: 0x1}\n")  # the same key once resolved


def list_of(*items: dict) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(items)}, sort_keys=False)


def benchmark_document(name: str) -> dict:
    return {"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": name},
            "spec": {"sweep": {"strategies": [{"name": "ddp"}]}}}


def test_a_kind_list_is_expanded_as_kubectl_expands_it(cluster, tmp_path):
    """`kubectl get -o yaml` writes several objects as a v1 List; `kubectl apply -f` takes its items, and so do
    render, run and validate, in the same order; a List in a List, which kubectl refuses, is refused too."""
    from gpt2bench.specification.validation import load_benchmarks_file

    text = list_of(benchmark_document("first"), benchmark_document("second"), benchmark_document("third"))
    path = tmp_path / "list.yaml"
    path.write_text(text + "---\n" + yaml.safe_dump(benchmark_document("fourth")))
    # --validate=false: kubectl's server-side validation asks OpenAPI about v1 List, which the emulator lacks
    done = cluster.kubectl("apply", "--dry-run=client", "--validate=false", "-o", "name", "-f", "-",
                           input=path.read_text())
    assert done.stdout.split() == [f"gpt2benchmark.gpt2bench.io/{n}" for n in ("first", "second", "third", "fourth")]
    assert [b.name for b in load_benchmarks_file(str(path))] == ["first", "second", "third", "fourth"]
    assert [b.name for b in load_benchmarks_file(str(path), "second")] == ["second"]
    nested = list_of(benchmark_document("fine"), {"apiVersion": "v1", "kind": "List",
                                                  "items": [benchmark_document("deep")]})
    path.write_text(nested)
    refused = cluster.kubectl("apply", "--dry-run=client", "--validate=false", "-o", "name", "-f", "-",
                              input=nested, check=False)
    assert refused.returncode == 1 and "is not a list" in refused.stderr
    bad = list_of(benchmark_document("fine"), {**benchmark_document("bad"), "spec": {
        "sweep": {"strategies": [{"name": "ddp"}]}, "concurrency": 0}})
    path.write_text(nested + "---\n" + bad)
    with pytest.raises(SpecError) as caught:
        load_benchmarks_file(str(path))
    assert caught.value.lines() == [
        f"{path}: document 1 (line 1): items[1]: a List inside a List: kubectl does not take it; list the objects "
        "in the outer List's items",
        f"{path}: document 2 (line 24): items[1].spec.concurrency: Input should be greater than or equal to 1, "
        "got 0"]


def several(*names: str, extra: str = "") -> bytes:
    """A file of GPT2Benchmarks, one per name, with an empty document between the first two."""
    parts = [VALID.replace(b"name: ok", f"name: {name}".encode()) + extra.encode() for name in names]
    return b"---\n".join(parts[:1] + [b"# nothing\n"] + parts[1:])


def test_validate_checks_every_benchmark_of_a_file_or_the_one_named(tmp_path, capsys):
    from gpt2bench.cli import main

    path = tmp_path / "two.yaml"
    path.write_bytes(several("first", "second"))
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[1] for line in out] == ["first", "second"] and "valid, 1 runs as written" in out[0]
    assert main(["validate", str(path), "--name", "second"]) == 0
    assert capsys.readouterr().out.split(": ")[1] == "second"
    assert main(["validate", str(path), "--name", "third"]) == 2
    assert "--name third: no GPT2Benchmark of that name here (it holds first, second)" in capsys.readouterr().err


def test_render_takes_each_benchmark_in_turn_or_the_one_named(tmp_path, capsys):
    path = tmp_path / "two.yaml"
    path.write_bytes(several("first", "second"))
    assert render_main([str(path)]) == 0  # as kubectl apply -f: every benchmark's jobs, in file order
    objects = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o]
    assert [o["metadata"]["labels"]["gpt2bench.io/benchmark"] for o in objects if o["kind"] != "NetworkPolicy"] == [
        "first", "second"]
    assert render_main([str(path), "--name", "second"]) == 0
    objects = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o]
    assert {o["metadata"]["labels"]["gpt2bench.io/benchmark"] for o in objects} == {"second"}
    assert render_main([str(path), "--name", "third"]) == 2
    assert "--name third: no GPT2Benchmark of that name here" in capsys.readouterr().err
    with pytest.raises(SpecError, match="pick one with --name NAME"):  # the library call that wants one
        load_benchmark_file(str(path))


def test_every_document_is_checked_before_anything_runs(tmp_path, capsys):
    path = tmp_path / "two.yaml"
    path.write_bytes(several("first", "second").replace(b"{name: second}", b"{name: second, labels: {a: [1]}}")
                     + b"  training: {steps: 0}\n")
    assert run_cli.main([str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"gpt2bench run: {path}: document 3 (second, line 9): metadata.labels.a:" in err
    assert f"gpt2bench run: {path}: document 3 (second, line 9): spec.training.steps:" in err
    assert "document 1" not in err and "nothing was run" in err and not (tmp_path / "out").exists()


@pytest.mark.timeout(300)
@pytest.mark.slow  # real trainer processes (make test-fast skips the multi-process tests)
def test_run_takes_each_benchmark_in_turn_into_its_own_folder(tmp_path, monkeypatch, sweeps_forked):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    path = tmp_path / "two.yaml"
    path.write_bytes(several("first", "second", extra="  training: {steps: 3, warmupSteps: 1, seqLen: 32}\n"
                                                  f"  model: {{nEmbd: {TINY_N_EMBD}}}\n"))
    assert run_cli.main([str(path), "--output", str(tmp_path / "out")]) == 0
    for name in ("first", "second"):
        results = json.loads((tmp_path / "out" / name / "results.json").read_text())
        assert [run["name"] for run in results["runs"]] == [f"{name}-ddp-fp32-1x1"]
        assert results["runs"][0]["phase"] == "Succeeded"
    assert run_cli.main([str(path), "--name", "second", "--output", str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / "results.json").exists() and not (tmp_path / "one" / "first").exists()
