"""An object a run needs before its job (its NetworkPolicy, its benchmark's own TrainingRuntime) whose name is taken:
ours (created by an earlier step, or before a restart) is used again; another owner's is refused naming whose it
is, so that no job starts fenced by rules or built from a runtime that is not this benchmark's. Against the
emulated API, through the operator's own client."""

from __future__ import annotations

import os
from unittest import mock

import pytest
from kube import EmulatedCluster
from kube.fixtures import install_crds
from kubeflow_crds import TRAINER_V2_CRD_FILES, crd_dir

from gpt2bench.controller import kube

OURS, THEIRS = "uid-ours", "uid-theirs"


def owned(obj: dict, uid: str) -> dict:
    refs = [{"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "name": "b", "uid": uid,
             "controller": True}]
    return {**obj, "metadata": {**obj["metadata"], "ownerReferences": refs}}


POLICY = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
          "metadata": {"name": "b-ddp-fp32-1x2", "namespace": "default"}, "spec": {"podSelector": {}}}
RUNTIME = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
           "metadata": {"name": "b-gpt2bench-torch-0123abcd", "namespace": "default"},
           "spec": {"template": {"spec": {"replicatedJobs": []}}}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with EmulatedCluster(tmp_path_factory.mktemp("namesakes")) as emulated:
        install_crds(emulated)
        emulated.kubectl("create", "-f", str(crd_dir() / TRAINER_V2_CRD_FILES[("trainer.kubeflow.org/v1alpha1",
                                                                                "TrainingRuntime")]))
        with mock.patch.dict(os.environ, {"KUBECONFIG": str(emulated.kubeconfig)}), \
                mock.patch.object(kube, "_client", None):  # this cluster's client, for this module only
            kube.configure()
            yield emulated


@pytest.mark.parametrize(("obj", "create"), [(POLICY, kube.create_network_policy),
                                             (RUNTIME, kube.create_training_runtime)], ids=["policy", "runtime"])
def test_a_namesake_is_ours_again_or_refused_naming_its_owner(cluster, obj, create):
    assert create(owned(obj, OURS), OURS) == kube.Created(new=True)
    assert create(owned(obj, OURS), OURS) == kube.Created(new=False)  # a step run again: the same object
    refused = create(owned(obj, THEIRS), THEIRS)
    assert isinstance(refused, kube.Refused) and not refused.kind_missing
    name, kind = obj["metadata"]["name"], obj["kind"]
    assert refused.reason.startswith(f"a {kind} named {name} already exists in default and belongs to GPT2Benchmark b "
                                     f"(uid {OURS}), not to this GPT2Benchmark (uid {THEIRS}): ")
    assert refused.reason.endswith(f"Delete that {kind}, or give this benchmark another name")
