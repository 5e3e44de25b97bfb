"""What a run expects of the cluster's fabric (`spec.fabric`), so that a multi-node GPU run either uses it or
stops within a minute saying why, instead of measuring TCP for hours (docs/clusters.md).

- `require`: `auto` (default) stops a multi-node GPU run whose NCCL connected nodes over sockets (NET/Socket)
  after its first step; `rdma` says a fabric (InfiniBand, RoCE, EFA, GKE's gIB) was asked for: every rank
  also checks at start that it can register memory (RLIMIT_MEMLOCK, CAP_IPC_LOCK) and sees an RDMA device,
  and fails at once with the node-level fix when it cannot; `none` is the opt-out for a socket baseline
  (nothing stops the run; the summary still says which transport it used).
- `gpuDirectRdma`: also stop a multi-node run whose network channels did not move GPU memory directly; unset,
  where the pods' env promises it (`NCCL_NET_GDR_LEVEL`, `FI_EFA_USE_DEVICE_RDMA=1`), so that a fragment that asks
  NCCL for GPUDirect also checks that it got it.
- `ncclEnvScript`: a script of `export NCCL_...` lines the node provides (GKE gIB's
  /usr/local/gib/scripts/set_nccl_env.sh), sourced by every rank before NCCL starts, so that its values,
  which change with the plugin's version, are the node's and not a copy.

The trainer reads them from its environment (gpt2bench.conventions, render/pods.py): gpt2bench/trainer/fabric.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from gpt2bench.specification.fielderrors import RuleError
from gpt2bench.specification.kubesyntax import ABSOLUTE_PATH_PATTERN
from gpt2bench.specification.values import SpecModel, cel

FabricRequire = Literal["auto", "rdma", "none"]
# NCCL_NET_GDR_LEVEL values that turn GPUDirect RDMA off (NCCL env docs: LOC, or 0, "never").
GDR_LEVEL_OFF = ("LOC", "0")


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
    gpu_direct_rdma: bool | None = Field(
        None, description="Also stop a multi-node GPU run whose network channels did not move GPU memory directly "
                          "(NCCL's /GDRDMA), at start. Unset: where pods.env promises it (NCCL_NET_GDR_LEVEL other "
                          "than LOC, FI_EFA_USE_DEVICE_RDMA=1) and require is not none; false: never.")
    nccl_env_script: str | None = Field(
        None, min_length=2, max_length=4096, pattern=ABSOLUTE_PATH_PATTERN,
        description="A script of `export NCCL_...=...` lines on the node (mounted with pods.volumes), sourced by "
                    "every rank before NCCL starts; its NCCL_* values apply where spec.pods.env does not set "
                    "them (GKE gIB: /usr/local/gib/scripts/set_nccl_env.sh).")

    def expects_gpudirect(self, env: dict[str, str | None]) -> bool:
        """Whether the run stops where NCCL moved no GPU memory directly: asked for, or promised by the env the
        profiles in manifests/examples/fabrics/ set (AKS: NCCL_NET_GDR_LEVEL=SYS; EKS: FI_EFA_USE_DEVICE_RDMA=1), unless
        turned off (false) or nothing is checked (require none). `env`: spec.pods.env's plain values by name."""
        if self.gpu_direct_rdma is not None:
            return self.gpu_direct_rdma
        if self.require == "none":
            return False
        level = (env.get("NCCL_NET_GDR_LEVEL") or "").strip().upper()
        return (bool(level) and level not in GDR_LEVEL_OFF) or (env.get("FI_EFA_USE_DEVICE_RDMA") or "").strip() == "1"

    @model_validator(mode="after")
    def _gpudirect_needs_a_check(self) -> FabricSpec:
        if self.gpu_direct_rdma and self.require == "none":
            raise RuleError([(("gpuDirectRdma",), "needs require auto or rdma: with none nothing stops a run for "
                              "its transport")])
        return self
