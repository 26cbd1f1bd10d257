"""`relay serve` as a child process on loopback for the hardening tests: free ports, replays in a
temporary directory, JSON logs in a file, optional RLIMIT_NOFILE for the child only."""
from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RelayServe:
    def __init__(self, tmp_path: Path, *, nofile: int | None = None, **settings: str):
        self.udp_port = free_port(socket.SOCK_DGRAM)
        self.http_port = free_port(socket.SOCK_STREAM)
        self.replays = tmp_path / "replays"
        self.log_path = tmp_path / "relay.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        env.update(PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   RELAY_SERVER_UDP_HOST="127.0.0.1", RELAY_SERVER_UDP_PORT=str(self.udp_port),
                   RELAY_SERVER_HTTP_HOST="127.0.0.1", RELAY_SERVER_HTTP_PORT=str(self.http_port),
                   RELAY_REPLAY_DIRECTORY=str(self.replays), RELAY_SERVER_LOG_FORMAT="json",
                   RELAY_SERVER_DRAIN_TIMEOUT="0")
        env.update(settings)

        def limit_descriptors() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen([sys.executable, "-m", "relay.cli", "serve"], env=env,
                                        cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                        preexec_fn=limit_descriptors)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.get("/health", timeout=2)
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError("relay serve did not come up:\n" + self.log()[-3000:])
                time.sleep(0.1)

    def get(self, path: str, timeout: float = 5.0) -> dict:
        url = f"http://127.0.0.1:{self.http_port}{path}"
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_events(self) -> list[dict]:
        events = []
        for line in self.log().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
        return events

    def stop(self) -> None:
        """SIGTERM and wait (replays close cleanly); SIGKILL if it hangs."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self._log.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=5)
        self._log.close()
