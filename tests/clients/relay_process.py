"""What the native-client tests share: a real `relay serve` on free loopback ports, and the
frame hash every test client prints (clients/c/examples/relay_player.c defines it; the C# bot
and the Python side compute the same)."""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from relay.protocol import EVENT_KINDS

FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def fnv1a(data: bytes, value: int = FNV_OFFSET) -> int:
    for byte in data:
        value = ((value ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return value


def frame_bytes(frame) -> bytes:
    """One frame as relay_player hashes it: u32 number, u32 slot count; per slot 0xFF if nil
    else 0x01, u16 length, the bytes; u32 event count; per event u8 kind, u32 slot, u8 name
    length, the name; little-endian throughout."""
    data = bytearray(struct.pack("<II", frame.number, len(frame.inputs)))
    for payload in frame.inputs:
        data += b"\xff" if payload is None else struct.pack("<BH", 1, len(payload)) + payload
    data += struct.pack("<I", len(frame.events))
    for kind, slot, name in frame.events:
        encoded = name.encode()
        data += struct.pack("<BIB", EVENT_KINDS.index(kind), slot, len(encoded)) + encoded
    return bytes(data)


def frames_hash(frames) -> str:
    """relay_player's "hash" of a whole stream, as 16 hex digits."""
    value = FNV_OFFSET
    for frame in frames:
        value = fnv1a(frame_bytes(frame), value)
    return f"{value:016x}"


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RelayProcess:
    """`relay serve` as a subprocess on free loopback ports, replays in tmp_path/replays;
    ``settings`` are RELAY_* variables (e.g. RELAY_SECURITY_MODE="token")."""

    def __init__(self, tmp_path: Path, **settings: str):
        self.udp_port, self.http_port = free_port(), free_port(socket.SOCK_STREAM)
        self.base = f"http://127.0.0.1:{self.http_port}"
        self.replays = tmp_path / "replays"
        self.log_path = tmp_path / "relay.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        env.update(RELAY_SERVER_UDP_HOST="127.0.0.1", RELAY_SERVER_UDP_PORT=str(self.udp_port),
                   RELAY_SERVER_HTTP_HOST="127.0.0.1", RELAY_SERVER_HTTP_PORT=str(self.http_port),
                   RELAY_REPLAY_DIRECTORY=str(self.replays), RELAY_SERVER_LOG_FORMAT="json")
        env.update(settings)
        self._log = open(self.log_path, "w")     # a file, not a pipe: nobody reads it live
        self.process = subprocess.Popen([sys.executable, "-m", "relay.cli", "serve"], env=env,
                                        cwd=tmp_path, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.http("GET", "/health")
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError("relay serve did not come up:\n"
                                       + self.log_path.read_text()[-3000:])
                time.sleep(0.1)

    def http(self, method: str, path: str, body=None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read() or b"null")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self._log.close()
