"""Serve the emulator over real HTTP on 127.0.0.1 from a background thread; write a kubeconfig.

Everything else in the tests talks to it as to a cluster: the `kubernetes` client, `kubectl`, kopf.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import kmock
import yaml

from .emulator import KubeEmulator
from .tools import kubectl


class EmulatedCluster:
    """`with EmulatedCluster(tmp_path) as cluster:` → `cluster.url`, `cluster.kubeconfig`."""

    def __init__(self, workdir: Path, port: int | None = None):
        self.workdir = Path(workdir)
        self.port = port
        self.url = ""
        self.kubeconfig = self.workdir / "kubeconfig"
        self.emulator: KubeEmulator | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kube-emulator", daemon=True)
        self._error: BaseException | None = None

    def __enter__(self) -> EmulatedCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        if not self._ready.wait(20) or self._error:
            raise RuntimeError(f"the API emulator did not start: {self._error!r}")
        self._write_kubeconfig()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            async with KubeEmulator() as emulator, kmock.Server(emulator, port=self.port) as server:
                self.emulator = emulator
                self.url = f"http://127.0.0.1:{server.port}"
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # surfaced by __enter__
            self._error = exc
            self._ready.set()

    def call(self, fn: Any, *args: Any) -> Any:
        """Run `fn(emulator, *args)` (sync or async) on the emulator's loop: safe direct store access."""

        async def wrapped() -> Any:
            result = fn(self.emulator, *args)
            return await result if asyncio.iscoroutine(result) else result

        assert self._loop is not None
        future: concurrent.futures.Future = asyncio.run_coroutine_threadsafe(wrapped(), self._loop)
        return future.result(10)

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "emulated"}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester",
                                                          "namespace": "default"}}],
        }
        tmp = self.kubeconfig.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(config))
        os.replace(tmp, self.kubeconfig)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Run the real kubectl against the emulator."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(self.workdir)}
        result = subprocess.run([kubectl(), *args], input=input, capture_output=True, text=True, env=env, timeout=60,
                                check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result
