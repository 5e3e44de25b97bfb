"""What the operator says at start about the cluster's Kubeflow operators, against the emulated API: the same
discovery and runtime reads the running operator makes (`prerequisites.report`, called by its startup handler;
tests/test_install_paths.py sees the line in a started operator's log).

A cluster without the training operator, the MPI operator or Trainer v2 failed every run, and one where the
chart went in before Trainer v2 had no runtimes, with nothing said until a run failed; the operator now warns
at start, naming what to install.
"""

from __future__ import annotations

import logging
import os
from unittest import mock

import pytest
from kube import EmulatedCluster
from kube.fixtures import CRD, install_crds, install_trainer_v2

from gpt2bench.controller import kube, prerequisites
from gpt2bench.controller.followedkinds import (
    MPI_OPERATOR_INSTALL,
    RUNTIMES_INSTALL,
    TRAINER_V2_INSTALL,
    TRAINING_OPERATOR_INSTALL,
)

pytestmark = pytest.mark.timeout(120)


def said(cluster: EmulatedCluster, caplog: pytest.LogCaptureFixture) -> tuple[list[str], list[str]]:
    """(info lines, warnings) of one report against `cluster`, through a client configured as the operator's."""
    caplog.clear()
    with mock.patch.dict(os.environ, {"KUBECONFIG": str(cluster.kubeconfig)}):
        kube.configure()
    with caplog.at_level(logging.INFO, logger="test.prerequisites"):
        prerequisites.report(logging.getLogger("test.prerequisites"))
    ours = [r for r in caplog.records if r.name == "test.prerequisites"]  # not the emulator's access log
    return ([r.getMessage() for r in ours if r.levelno == logging.INFO],
            [r.getMessage() for r in ours if r.levelno == logging.WARNING])


def test_the_operator_says_at_start_which_kinds_are_missing_and_what_to_install(tmp_path, caplog):
    with EmulatedCluster(tmp_path) as cluster:
        cluster.kubectl("apply", "-f", str(CRD))  # gpt2bench's own only
        info, (warning,) = said(cluster, caplog)
        assert info == ["job kinds served: none of TrainJob, PyTorchJob, MPIJob; spec.backend auto resolves to "
                        "trainjob"]
        assert "every run fails until one backend is installed" in warning
        for command in (TRAINER_V2_INSTALL, TRAINING_OPERATOR_INSTALL, MPI_OPERATOR_INSTALL):
            assert command in warning

        install_crds(cluster)  # the v1 operators: PyTorchJob and MPIJob v2beta1
        info, warnings = said(cluster, caplog)
        assert info == ["job kinds served: MPIJob, PyTorchJob; spec.backend auto resolves to pytorchjob"]
        assert warnings == []

        install_trainer_v2(cluster)  # then Trainer v2, after the chart: no runtimes yet
        info, (warning,) = said(cluster, caplog)
        assert info == ["job kinds served: MPIJob, PyTorchJob, TrainJob; spec.backend auto resolves to trainjob"]
        assert warning == ("Kubeflow Trainer v2 is installed but gpt2bench's ClusterTrainingRuntimes gpt2bench-torch, "
                           "gpt2bench-mpi, gpt2bench-mpi-cuda, gpt2bench-mpi-one-node are not: TrainJob runs on "
                           f"them fail until: {RUNTIMES_INSTALL}")

        cluster.kubectl("apply", "-f", str(CRD.parent / "runtimes.yaml"))  # as the warning says
        assert said(cluster, caplog)[1] == []


def test_an_api_that_cannot_be_asked_is_a_warning_not_a_crash(tmp_path, caplog):
    with EmulatedCluster(tmp_path) as cluster, \
            mock.patch.object(kube, "served_job_kinds", side_effect=ConnectionRefusedError("refused")):
        _, (warning,) = said(cluster, caplog)
    assert warning == "could not check which Kubeflow job kinds this cluster serves: refused"

