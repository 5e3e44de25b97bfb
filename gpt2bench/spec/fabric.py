"""What a run expects of the cluster's fabric (`spec.fabric`), so that a multi-node GPU run either uses it or
stops within a minute saying why, instead of measuring TCP for hours (docs/clusters.md).

- `require`: `auto` (default) stops a multi-node GPU run whose NCCL connected nodes over sockets (NET/Socket)
  after its first step; `rdma` says a fabric (InfiniBand, RoCE, EFA, GKE's gIB) was asked for: every rank
  also checks at start that it can register memory (RLIMIT_MEMLOCK, CAP_IPC_LOCK) and sees an RDMA device,
  and fails at once with the node-level fix when it cannot; `none` is the opt-out for a socket baseline
  (nothing stops the run; the summary still says which transport it used).
- `gpuDirectRdma`: also stop a multi-node run whose network channels did not move GPU memory directly.
- `ncclEnvScript`: a script of `export NCCL_...` lines the node provides (GKE gIB's
  /usr/local/gib/scripts/set_nccl_env.sh), sourced by every rank before NCCL starts, so that its values,
  which change with the plugin's version, are the node's and not a copy.

The trainer reads them from its environment (gpt2bench.protocol, render/pods.py): gpt2bench/trainer/fabric.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from gpt2bench.spec.fielderrors import RuleError
from gpt2bench.spec.kubesyntax import ABSOLUTE_PATH_PATTERN
from gpt2bench.spec.values import SpecModel, cel

FabricRequire = Literal["auto", "rdma", "none"]


class FabricSpec(SpecModel):
    """What a run expects of the fabric between its nodes (docs/clusters.md, Stopping a run off its fabric)."""

    model_config = ConfigDict(json_schema_extra=cel(
        ("!has(self.gpuDirectRdma) || !self.gpuDirectRdma || $require != 'none'",
         "gpuDirectRdma needs require auto or rdma: with none nothing stops a run for its transport"),
    ))

    require: FabricRequire = Field(
        "auto",
        description="auto: a multi-node GPU run whose NCCL reached the other nodes over sockets (NET/Socket) stops "
                    "after its first step, saying so. rdma: a fabric was asked for (InfiniBand, RoCE, EFA, gIB): "
                    "every rank also checks at start that it may lock enough memory for RDMA (RLIMIT_MEMLOCK, "
                    "CAP_IPC_LOCK) and sees an RDMA device, and fails at once with the node-level fix otherwise. "
                    "none: a socket baseline; nothing stops a run for its transport.")
    gpu_direct_rdma: bool = Field(
        False, description="Also stop a multi-node GPU run whose network channels did not move GPU memory directly "
                           "(NCCL's /GDRDMA), after its first step.")
    nccl_env_script: str | None = Field(
        None, min_length=2, max_length=4096, pattern=ABSOLUTE_PATH_PATTERN,
        description="A script of `export NCCL_...=...` lines on the node (mounted with pods.volumes), sourced by "
                    "every rank before NCCL starts; its NCCL_* values apply where spec.pods.env does not set "
                    "them (GKE gIB: /usr/local/gib/scripts/set_nccl_env.sh).")

    @model_validator(mode="after")
    def _gpudirect_needs_a_check(self) -> FabricSpec:
        if self.gpu_direct_rdma and self.require == "none":
            raise RuleError([(("gpuDirectRdma",), "needs require auto or rdma: with none nothing stops a run for "
                              "its transport")])
        return self
