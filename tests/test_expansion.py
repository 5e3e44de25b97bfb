"""`$(VAR)` expansion as the kubelet does it, one implementation for the renderer's escape and the local runner
(gpt2bench/specification/expansion.py), and a user's strings reaching the trainer as written on every kind of job."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpt2bench.local.executor import job_replicas
from gpt2bench.local.replicas import container_env
from gpt2bench.plan import plan_runs
from gpt2bench.render import render_job
from gpt2bench.specification.expansion import escape, expand
from gpt2bench.specification.validation import load_benchmark
from gpt2bench.trainer.config import TrainConfig

# The test table of k8s.io/kubernetes third_party/forked/golang/expansion/expand_test.go (doExpansionTest), as
# (name, input, expected) against its context; the kubelet expands env values, command and args with that code.
CONTEXT = {"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_REF": "$(VAR_A)", "VAR_EMPTY": ""}
UPSTREAM_CASES = [
    ("whole string", "$(VAR_A)", "A"),
    ("repeat", "$(VAR_A)-$(VAR_A)", "A-A"),
    ("beginning", "$(VAR_A)-1", "A-1"),
    ("middle", "___$(VAR_B)___", "___B___"),
    ("end", "___$(VAR_C)", "___C"),
    ("compound", "$(VAR_A)_$(VAR_B)_$(VAR_C)", "A_B_C"),
    ("escape & expand", "$$(VAR_B)_$(VAR_A)", "$(VAR_B)_A"),
    ("compound escape", "$$(VAR_A)_$$(VAR_B)", "$(VAR_A)_$(VAR_B)"),
    ("mixed in escapes", "f000-$$VAR_A", "f000-$VAR_A"),
    ("backslash escape ignored", "foo\\$(VAR_C)bar", "foo\\Cbar"),
    ("backslash escape ignored, twice", "foo\\\\$(VAR_C)bar", "foo\\\\Cbar"),
    ("lots of backslashes", "foo\\\\\\\\$(VAR_A)bar", "foo\\\\\\\\Abar"),
    ("nested var references", "$(VAR_A$(VAR_B))", "$(VAR_A$(VAR_B))"),
    ("nested var references second type", "$(VAR_A$(VAR_B)", "$(VAR_A$(VAR_B)"),
    ("value is a reference", "$(VAR_REF)", "$(VAR_A)"),
    ("value is a reference x 2", "%%$(VAR_REF)--$(VAR_REF)%%", "%%$(VAR_A)--$(VAR_A)%%"),
    ("empty var", "foo$(VAR_EMPTY)bar", "foobar"),
    ("unterminated expression", "foo$(VAR_Awhoops!", "foo$(VAR_Awhoops!"),
    ("expression without operator", "f00__(VAR_A)__", "f00__(VAR_A)__"),
    ("shell special vars pass through", "$?_boo_$!", "$?_boo_$!"),
    ("bare operators are ignored", "$VAR_A", "$VAR_A"),
    ("undefined vars are passed through", "$(VAR_DNE)", "$(VAR_DNE)"),
    ("multiple (even) operators, var undefined", "$$$$$$(BIG_MONEY)", "$$$(BIG_MONEY)"),
    ("multiple (even) operators, var defined", "$$$$$$(VAR_A)", "$$$(VAR_A)"),
    ("multiple (odd) operators, var undefined", "$$$$$$$(GOOD_ODDS)", "$$$$(GOOD_ODDS)"),
    ("multiple (odd) operators, var defined", "$$$$$$$(VAR_A)", "$$$A"),
    ("missing open expression", "$VAR_A)", "$VAR_A)"),
    ("shell syntax ignored", "${VAR_A}", "${VAR_A}"),
    ("trailing incomplete expression not consumed", "$(VAR_B)_______$(A", "B_______$(A"),
    ("trailing incomplete expression, no content, is not consumed", "$(VAR_C)_______$(", "C_______$("),
    ("operator at end of input string is preserved", "$(VAR_A)foobarzab$", "Afoobarzab$"),
    ("shell escaped incomplete expr", "foo-\\$(VAR_A", "foo-\\$(VAR_A"),
    ("lots of $( in middle", "--$($($($($--", "--$($($($($--"),
    ("lots of $( in beginning", "$($($($($--foo$(", "$($($($($--foo$("),
    ("lots of $( at end", "foo0--$($($($(", "foo0--$($($($("),
    ("escaped operators in variable names are not escaped", "$(foo$$var)", "$(foo$$var)"),
    ("newline not expanded", "\n", "\n"),
]


@pytest.mark.parametrize("name, text, expected", UPSTREAM_CASES, ids=[case[0] for case in UPSTREAM_CASES])
def test_expansion_follows_the_kubelets_own_test_table(name, text, expected):
    assert expand(text, CONTEXT) == expected


def test_env_values_expand_against_the_entries_before_them_like_the_kubelet():
    """Upstream's TestMapReference: each value sees the values declared before it, already expanded."""
    container = {"env": [{"name": "FOO", "value": "bar"}, {"name": "ZOO", "value": "$(FOO)-1"},
                         {"name": "BLU", "value": "$(ZOO)-2"}, {"name": "LATE", "value": "$(AFTER)"},
                         {"name": "AFTER", "value": "x"}]}
    env = container_env(container, {}, {})
    assert env == {"FOO": "bar", "ZOO": "bar-1", "BLU": "bar-1-2", "LATE": "$(AFTER)", "AFTER": "x"}


@given(text=st.text(alphabet=st.sampled_from("$()ab_\\é"), max_size=40),
       variables=st.dictionaries(st.sampled_from(["a", "b", "", "a$", "(a"]), st.text(max_size=5)))
def test_an_escaped_string_expands_back_to_itself_whatever_is_defined(text, variables):
    assert expand(escape(text), variables) == text


SOURCE = "/data/$(HOME)/price$$list $x"
PRETRAINED = "/weights/$(GPT2BENCH_OUTPUT_DIR)/$(MASTER_ADDR)"


@pytest.mark.parametrize("strategy, backend", [("ddp", "pytorchjob"), ("horovod", "pytorchjob"),
                                               ("ddp", "trainjob"), ("horovod", "trainjob")])
def test_a_users_strings_reach_the_trainer_as_written_through_render_and_the_kubelets_expansion(
        tmp_path, strategy, backend):
    """The renderer escapes the spec's strings in the trainer's args; the local runner expands the rendered job as
    the kubelet would (the same `expand`): the trainer reads the data source and pretrained path as written, and
    `--output` becomes the replica's folder."""
    bench = load_benchmark({
        "apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "dollars"},
        "spec": {"backend": backend, "data": {"source": SOURCE}, "model": {"preset": "tiny", "pretrained": PRETRAINED},
                 "sweep": {"strategies": [{"name": strategy}], "precisions": ["fp32"],
                           "scales": [{"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2}]}},
    })
    (run,) = plan_runs(bench)
    job = render_job(bench, run)
    assert SOURCE not in str(job) and escape(SOURCE) in str(job)  # the kubelet would have expanded it
    launcher = job_replicas(job, tmp_path)[0]
    config = TrainConfig.from_argv(launcher.argv[launcher.argv.index("train") + 1:])
    assert (config.data.source, config.model.pretrained) == (SOURCE, PRETRAINED)
    assert config.process.output == str(launcher.output_dir)
