"""A Kubernetes API for tests: kmock 0.8's emulator with its gaps filled, served over real HTTP.

`EmulatedCluster` runs it in a thread and writes a kubeconfig; `TrainingOperator` plays the Kubeflow
training/MPI operators (job conditions, the master/launcher pod and its termination message).
"""

from .cluster import EmulatedCluster
from .emulator import KubeEmulator

__all__ = ["EmulatedCluster", "KubeEmulator"]
