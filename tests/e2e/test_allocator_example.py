"""examples/allocator.py, the whole path from matchmaker to first frame, without a cluster: the
Kubernetes API is a stand-in that validates the GameServerAllocation against its schema and
applies it to the stand-in SDK sidecar (tests/agones_sidecar.py) of a real relay in token mode.
"""
from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import yaml

from agones_sidecar import SidecarStandIn
from live_relay import Player
from relay.client import RelayClient
from relay.config import load_config
from relay.server.daemon import RelayServer
from relay_core.token import generate_key

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "tests" / "schemas" / "agones-gameserverallocation.schema.json")
                    .read_text())
ADMIN_TOKEN = "allocator-test-admin-token-0123456789"

spec = importlib.util.spec_from_file_location("allocator", ROOT / "examples" / "allocator.py")
allocator = importlib.util.module_from_spec(spec)
sys.modules["allocator"] = allocator
spec.loader.exec_module(allocator)


class KubernetesStandIn:
    """CustomObjectsApi.create_namespaced_custom_object and CoreV1Api.read_namespaced_pod for
    one GameServer, whose SDK sidecar is ``sidecar``; called from the allocator's thread."""

    def __init__(self, loop, sidecar, udp_port):
        self.loop, self.sidecar, self.udp_port = loop, sidecar, udp_port
        self.labels = {"agones.dev/fleet": "relay", "app.kubernetes.io/version": "0.0.9"}
        self.requests = []

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        assert (group, version, plural) == ("allocation.agones.dev", "v1", "gameserverallocations")
        jsonschema.Draft202012Validator(SCHEMA).validate(body)
        self.requests.append(body)
        spec = body["spec"]
        actions = {key: action["amount"] for key, action in spec.get("counters", {}).items()}

        async def apply():
            for selector in spec["selectors"]:
                if any(self.labels.get(k) != v for k, v in selector["matchLabels"].items()):
                    continue
                minimum = {key: c["minAvailable"] for key, c in selector["counters"].items()}
                if self.sidecar.allocate(states=(selector["gameServerState"],),
                                         min_available=minimum, counters=actions,
                                         annotations=spec["metadata"]["annotations"]):
                    return True
            return False

        if asyncio.run_coroutine_threadsafe(apply(), self.loop).result(5):
            return {**body, "status": {
                "state": "Allocated", "gameServerName": self.sidecar.name,
                "address": "127.0.0.1", "nodeName": "node-1", "source": "local",
                "ports": [{"name": "game", "port": self.udp_port}]}}
        return {**body, "status": {"state": "UnAllocated", "gameServerName": ""}}

    def read_namespaced_pod(self, name, namespace):
        assert name == self.sidecar.name
        return SimpleNamespace(status=SimpleNamespace(pod_ip="127.0.0.1"))


def test_allocation_body_is_the_shipped_allocation():
    shipped = yaml.safe_load((ROOT / "deploy/kubernetes/agones/allocation.yaml").read_text())
    release = shipped["spec"]["selectors"][0]["matchLabels"]["app.kubernetes.io/version"]
    body = allocator.allocation_body("relay", "m-1", ["a", "b"], release=release)
    annotations = body["spec"].pop("metadata")["annotations"]
    shipped["spec"].pop("metadata")
    assert body["spec"] == shipped["spec"]
    assert json.loads(annotations["relay.rooms/allocation"]) == {"room": "m-1",
                                                                 "players": ["a", "b"]}
    jsonschema.Draft202012Validator(SCHEMA).validate(body)


def test_from_matchmaker_to_first_frame(tmp_path):
    key = generate_key()

    async def main():
        sidecar = await SidecarStandIn(counters={"rooms": (0, 1000)}).start()
        config = load_config(environ={
            "RELAY_SERVER_UDP_HOST": "127.0.0.1", "RELAY_SERVER_UDP_PORT": "0",
            "RELAY_SERVER_HTTP_HOST": "127.0.0.1", "RELAY_SERVER_HTTP_PORT": "0",
            "RELAY_REPLAY_DIRECTORY": str(tmp_path / "replays"),
            "RELAY_SECURITY_MODE": "token",
            "RELAY_SECURITY_KEYS": f"1:{base64.b64encode(key).decode()}",
            "RELAY_SECURITY_ADMIN_TOKEN": ADMIN_TOKEN,
            "RELAY_ROOMS_MAX_ROOMS": "1", "RELAY_ROOMS_AUTO_CREATE": "false",
            "RELAY_ROOMS_EMPTY_TIMEOUT": "0.5",
            "RELAY_AGONES_ENABLED": "true", "RELAY_AGONES_PORT": str(sidecar.port),
            "RELAY_AGONES_HEALTH_INTERVAL": "0.1", "RELAY_AGONES_BACKOFF_INITIAL": "0.01",
        })
        server = RelayServer(config)
        await server.start()
        kube = KubernetesStandIn(asyncio.get_running_loop(), sidecar, server.udp_address[1])
        # A relay of an older release: taken only because no relay of 0.1.0 exists.
        backend = allocator.Allocator(kube, kube, {1: key}, 1, release="0.1.0",
                                      admin_token=ADMIN_TOKEN,
                                      admin_port=server.http_port, token_ttl=30)
        players = []
        try:
            for _ in range(100):
                if server.agones.state == "Ready":
                    break
                await asyncio.sleep(0.02)
            match = await asyncio.to_thread(backend.allocate_match, ["alice", "bob"])
            assert match.address == "127.0.0.1" and match.port == server.udp_address[1]
            assert set(match.tokens) == {"alice", "bob"}
            room = server.rooms[match.room]
            assert room.capacity == 2
            assert sidecar.state == "Allocated" and sidecar.counters["rooms"]["count"] == 1
            # The only slot is taken: the next match finds no relay.
            with pytest.raises(allocator.NoCapacity):
                await asyncio.to_thread(backend.allocate_match, ["carol", "dan"])
            for name, token in match.tokens.items():
                client = await RelayClient.connect(match.address, match.port, token=token)
                players.append(Player(client, name))
            await players[0].client.wait_for_state("running")
            await asyncio.gather(*(player.play_until(10, 5) for player in players))
            assert [f.number for f in players[0].frames] == [f.number for f in players[1].frames]
            for player in players:
                await player.client.close()
            players = []
            # Both left: the room ends, its slot is freed, the relay is Ready for the next match.
            for _ in range(200):
                if sidecar.state == "Ready" and sidecar.counters["rooms"]["count"] == 0:
                    break
                await asyncio.sleep(0.02)
            assert sidecar.state == "Ready" and sidecar.counters["rooms"]["count"] == 0
            again = await asyncio.to_thread(backend.allocate_match, ["carol", "dan"])
            assert again.room != match.room and again.room in server.rooms
        finally:
            for player in players:
                await player.client.close()
            await server.stop()
            await sidecar.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
