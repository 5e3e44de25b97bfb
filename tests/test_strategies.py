"""The strategies' table (gpt2bench.strategies) is the one list: the spec, the trainer and the docs agree with it,
and the code that differs per strategy reads its traits, so a new row needs no branch elsewhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import repo_scripts

from gpt2bench import strategies
from gpt2bench.jobkinds import job_kind_for, max_job_name_length, trainjob_pods
from gpt2bench.render.runtimes import MPI_GPU_RUNTIME, MPI_ONE_NODE_RUNTIME, TORCH_RUNTIME, runtime_for
from gpt2bench.specification.model import STRATEGIES, StrategySpec
from gpt2bench.strategies import STRATEGY_TABLE, Strategy, option_owners, traits

REPO = Path(__file__).resolve().parents[1]
PARALLEL = REPO / "trainer" / "parallel"


def trainer_classes() -> dict[str, str]:
    """Every class under trainer/parallel that declares a strategy `name`: that name -> "module:Class", read from
    the source (importing horovod.py needs Horovod)."""
    found = {}
    for path in sorted(PARALLEL.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.ClassDef):
                continue
            for statement in node.body:
                if (isinstance(statement, ast.Assign) and [getattr(t, "id", None) for t in statement.targets] == ["name"]
                        and isinstance(statement.value, ast.Constant)):
                    assert statement.value.value not in found, f"two trainer classes are named {statement.value.value}"
                    found[statement.value.value] = f"{path.stem}:{node.name}"
    return found


def test_every_strategy_of_the_spec_has_its_trainer_class_and_every_trainer_class_is_in_the_spec():
    classes = trainer_classes()
    assert set(classes) == set(STRATEGIES), (
        f"spec only: {sorted(set(STRATEGIES) - set(classes))}; trainer only: {sorted(set(classes) - set(STRATEGIES))}")
    for strategy in STRATEGY_TABLE:
        assert classes[strategy.name] == strategy.trainer, f"{strategy.name}: the table names {strategy.trainer}"


def test_the_trainer_registry_resolves_the_table():
    from gpt2bench.trainer.parallel import STRATEGIES as REGISTRY
    from gpt2bench.trainer.parallel import strategy_class

    assert list(REGISTRY) == list(STRATEGIES)
    assert strategy_class("ddp").name == "ddp" and strategy_class("ps-sharded").name == "ps-sharded"
    with pytest.raises(KeyError, match="unknown strategy 'zero'"):
        strategy_class("zero")


def test_the_spec_accepts_exactly_the_table():
    for name in STRATEGIES:
        StrategySpec(name=name)
    with pytest.raises(ValueError, match="name"):
        StrategySpec(name="zero")


def test_every_strategy_option_is_a_spec_field_owned_by_a_strategy():
    fields = set(StrategySpec.model_fields) - {"name"}
    assert set(option_owners()) == fields
    with pytest.raises(ValueError, match="bucketCapMb"):
        StrategySpec(name="fsdp", bucket_cap_mb=25)
    with pytest.raises(ValueError, match="psServers"):
        StrategySpec(name="ps-sharded", ps_servers=1)


def test_the_docs_strategy_tables_are_written_from_the_table_and_current():
    docs_tables = repo_scripts.load("docs_tables")
    for path, kind in ((REPO / "README.md", "strategies-readme"), (REPO / "docs" / "strategies.md", "strategies")):
        text = path.read_text(encoding="utf-8")
        assert [m["kind"] for m in docs_tables.SECTION.finditer(text)] == [kind], f"{path}: one {kind} section"
        assert docs_tables.rewritten(text, path) == text, f"{path}: run python scripts/docs_tables.py --write"
        body = docs_tables.SECTION.search(text)["body"]
        assert [line.split(" | ")[0] for line in body.splitlines()[2:]] == [f"| `{name}`" for name in STRATEGIES]
    for strategy in STRATEGY_TABLE:
        for said in ("paper", "runs", "processes", "holds", "exchange"):
            assert getattr(strategy, said).strip(), f"{strategy.name}: its row says nothing of {said}"
    assert "| `horovod` | `horovod.py` | Bai 2022 \"Horovod\" | 1 per device" in docs_tables.table("strategies")


def test_a_new_row_reaches_both_docs_tables_and_a_stale_or_unknown_section_is_named(monkeypatch, tmp_path):
    docs_tables = repo_scripts.load("docs_tables")
    row = Strategy("local-sgd", "localsgd:LocalSGDParallelism", paper="Lin 2020", runs="DDP averaging every k steps",
                   processes="1 per device", holds="every rank a replica", exchange="parameter average every k steps")
    monkeypatch.setattr(docs_tables, "STRATEGY_TABLE", (*STRATEGY_TABLE, row))
    text = (REPO / "README.md").read_text(encoding="utf-8")
    new = docs_tables.rewritten(text, REPO / "README.md")
    assert new != text and "| `local-sgd` | DDP averaging every k steps | Lin 2020 |\n<!-- /table -->" in new
    assert "| `local-sgd` | `localsgd.py` | Lin 2020 | 1 per device |" in docs_tables.table("strategies")
    with pytest.raises(ValueError, match="README.md: unknown table 'wiki'"):
        docs_tables.rewritten(text.replace("table:strategies-readme", "table:wiki"), REPO / "README.md")
    monkeypatch.setattr(docs_tables, "DOCS", (tmp_path / "README.md",))
    (tmp_path / "README.md").write_text(text, encoding="utf-8")
    monkeypatch.setattr(docs_tables, "REPO", tmp_path)
    assert docs_tables.main(["--check"]) == 1
    assert docs_tables.main(["--write"]) == 0 and docs_tables.main(["--check"]) == 0
    assert "`local-sgd`" in (tmp_path / "README.md").read_text(encoding="utf-8")


def test_a_new_mpirun_strategy_becomes_an_mpijob_on_the_mpi_runtimes_by_its_row_alone(monkeypatch):
    """Jobs, runtimes and replicated jobs follow the launcher, not the name: a second mpirun strategy is rendered
    as horovod is."""
    row = Strategy("mpi-ddp", "ddp:DDPParallelism", launcher="mpirun")
    monkeypatch.setattr(strategies, "_BY_NAME", {**strategies._BY_NAME, row.name: row})
    for name in ("horovod", "mpi-ddp"):
        assert job_kind_for(name, "pytorchjob") == "MPIJob"
        assert (runtime_for(name, 1, False), runtime_for(name, 2, True)) == (MPI_ONE_NODE_RUNTIME, MPI_GPU_RUNTIME)
        assert trainjob_pods(name, 3) == {"node": 2, "launcher": 1}
        assert max_job_name_length("TrainJob", name, 2) == max_job_name_length("TrainJob", "horovod", 2)
    assert job_kind_for("ddp", "pytorchjob") == "PyTorchJob" and runtime_for("ddp", 2, True) == TORCH_RUNTIME
    assert trainjob_pods("ddp", 3) == {"node": 3}


def test_an_unknown_strategy_is_refused_naming_the_known_ones():
    with pytest.raises(KeyError, match="known: single, dataparallel, ddp"):
        traits("zero")
