"""Memory a ps worker shares with the servers of its node, so a push or pull there crosses no network.

A worker's flat gradient and flat parameter buffers are made shareable; each server of the same node
opens them once, from a handle sent at set-up, and from then on reads the worker's gradient range and
writes its new parameter range in place (a device-to-device copy on GPUs). The messages that say "pushed"
and "updated" stay small c10d headers, so the protocol is the same as over the network, only the payload
moves through shared memory. Servers on other nodes get the payload in c10d messages (`ps.py`).

- GPUs: CUDA IPC (`torch.multiprocessing.reductions.reduce_tensor`): the server maps the worker's device
  memory; a copy between two GPUs of the node goes peer to peer.
- CPU: a file in /dev/shm mapped by both (numpy memmap). The worker unlinks it as soon as every server has
  mapped it, so nothing is left behind if a process dies. When /dev/shm cannot hold the buffers (a
  container's default is 64 MiB) there is no sharing: the servers of the node use messages, and the
  summary's note says so.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

SHM_DIR = Path("/dev/shm")
SHM_MARGIN = 1.25  # leave room for other users of /dev/shm (torch, NCCL)


def shm_room(nbytes: int) -> tuple[bool, str]:
    """Whether /dev/shm can hold `nbytes` of CPU buffers; the reason when not."""
    try:
        stats = os.statvfs(SHM_DIR)
    except OSError as exc:
        return False, f"no /dev/shm ({exc})"
    free = stats.f_bavail * stats.f_frsize
    if free < nbytes * SHM_MARGIN:
        return False, f"/dev/shm has {free / 2**20:.0f} MiB free, the shared buffers need {nbytes / 2**20:.0f} MiB"
    return True, ""


class SharedBuffer:
    """A float32 vector on `device` that other processes of the node can open from `handle`."""

    def __init__(self, numel: int, device: torch.device):
        self.path: Path | None = None
        if device.type == "cuda":
            self.tensor = torch.zeros(numel, dtype=torch.float32, device=device)
            from torch.multiprocessing.reductions import reduce_tensor

            self.handle: Any = ("cuda", reduce_tensor(self.tensor))
        else:
            self.path = Path(tempfile.mkstemp(prefix=f"gpt2bench-ps-{uuid.uuid4().hex[:8]}-", dir=SHM_DIR)[1])
            os.truncate(self.path, numel * 4)
            array = np.memmap(self.path, dtype=np.float32, mode="r+", shape=(numel,))
            self.tensor = torch.from_numpy(array)
            self.handle = ("file", str(self.path), numel)

    def unlink(self) -> None:
        """Remove the name once every peer has mapped it (the mappings stay valid)."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


def open_shared(handle: Any) -> torch.Tensor:
    """The tensor another process of the node shares as `handle` (SharedBuffer.handle)."""
    if handle[0] == "cuda":
        rebuild, args = handle[1]
        return rebuild(*args)
    _, path, numel = handle
    return torch.from_numpy(np.memmap(path, dtype=np.float32, mode="r+", shape=(numel,)))
