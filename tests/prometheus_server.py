"""A real Prometheus (Debian's /usr/bin/prometheus) for tests: temp TSDB, 127.0.0.1, 1 s scrapes.

    with PrometheusServer(tmp_path, scrape_jobs, rule_files=[...]) as prom:
        prom.wait_for("up == 1")
        prom.query("rate(x[5s])")
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Self

import yaml

from gpt2bench.local.replicas import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


class PrometheusError(AssertionError):
    pass


class PrometheusServer:
    def __init__(self, workdir: Path, scrape_configs: list[dict[str, Any]], rule_files: list[Path] = ()) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": scrape_configs,
        }
        self.config_file = workdir / "prometheus.yml"
        self.config_file.write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.log = open(self.workdir / "prometheus.log", "wb")
        self.process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={self.config_file}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PrometheusError(f"prometheus exited: {(self.workdir / 'prometheus.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.1)
        raise PrometheusError("prometheus not ready after 30 s")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:  # 400: the expression does not parse or evaluate
            body = json.load(exc)
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; raises PrometheusError naming the expression when Prometheus rejects it."""
        return self.api("query", query=expr)["result"]

    def series(self, match: str) -> list[dict[str, str]]:
        return self.api("series", **{"match[]": match})

    def wait_for(self, expr: str, timeout: float = 30) -> list[dict[str, Any]]:
        """Poll until the expression returns something."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result:
                return result
            time.sleep(0.25)
        raise PrometheusError(f"no result for {expr!r} after {timeout} s")
