"""A matchmaker's backend for relays on Agones: from a match found to what each player needs.

For one match (its players) ``allocate_match``:

1. asks Agones for a room slot: a GameServerAllocation like deploy/kubernetes/agones/
   allocation.yaml (a relay of the current release first; an Allocated relay with a free slot
   before a Ready one, the fullest first; the Counter action takes the slot in the same
   update), naming the room and its players in the annotation ``relay.rooms/allocation``;
2. creates the room on the chosen relay through its admin API (``POST /rooms`` with
   ``"allocated": true``, on the pod's IP; the relay may already have created it from the
   annotation, then this returns it as it is);
3. mints each player's connect token with the relay's own token library
   (relay_core.token.mint_token, the same code as ``relay token mint``) and the keys the relays
   read (the Secret relay-secrets);
4. returns the relay's public address and game port, the room and the tokens: a game client
   joins with ``RelayClient.connect(address, port, token=token)``.

Run it where it can reach the Kubernetes API and the relays' pod network (in the cluster, with
a service account allowed to create gameserverallocations.allocation.agones.dev and get pods):

    pip install 'relay[agones]'
    python examples/allocator.py --players alice,bob --keys-file /etc/relay/secrets/keys.toml \\
        --admin-token-file /etc/relay/secrets/admin-token

It prints the result as JSON. A matchmaker imports ``Allocator`` instead; ``allocate_match`` is
synchronous (the kubernetes client is), run it in a thread pool from async code.
"""
from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Optional

from relay.config import ConfigError, minting_keys
from relay.server.agones import ALLOCATION_ANNOTATION
from relay_core.token import mint_token

GROUP, VERSION, PLURAL = "allocation.agones.dev", "v1", "gameserverallocations"
ADMIN_PORT = 9100
CONTENTION_RETRIES = 5


class NoCapacity(Exception):
    """No relay in the fleet has a free room slot (the autoscaler is behind, or at maxCapacity)."""


@dataclass
class Match:
    room: str
    gameserver: str
    address: str
    port: int
    tokens: dict[str, str] = field(default_factory=dict)
    expires: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"room": self.room, "gameserver": self.gameserver, "address": self.address,
                "port": self.port, "tokens": self.tokens, "expires": self.expires}


def allocation_body(fleet: str, room: str, players: list[str], counter: str = "rooms",
                    options: Optional[dict] = None, release: Optional[str] = None) -> dict:
    """The GameServerAllocation for one room (deploy/kubernetes/agones/allocation.yaml):
    relays of ``release`` (their app.kubernetes.io/version label) first, when given."""
    spec = {"room": room, "players": players, **(options or {})}
    labels = [{"agones.dev/fleet": fleet}]
    if release:
        labels.insert(0, {"agones.dev/fleet": fleet, "app.kubernetes.io/version": release})
    selectors = [{"matchLabels": match, "gameServerState": state,
                  "counters": {counter: {"minAvailable": 1}}}
                 for match in labels for state in ("Allocated", "Ready")]
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "GameServerAllocation",
        "metadata": {"generateName": f"{fleet}-room-"},
        "spec": {
            "scheduling": "Packed",
            "selectors": selectors,
            "priorities": [{"type": "Counter", "key": counter, "order": "Ascending"}],
            "counters": {counter: {"action": "Increment", "amount": 1}},
            "metadata": {"annotations": {ALLOCATION_ANNOTATION: json.dumps(spec)}},
        },
    }


def new_room_name() -> str:
    """Unique per match (the relay tells allocations apart by their room)."""
    return "m-" + secrets.token_hex(10)


class Allocator:
    """``custom_api``/``core_api``: kubernetes.client.CustomObjectsApi and CoreV1Api (or
    objects with the same two methods, for tests). ``keys``/``key_id``: the relays' token keys
    and the one to mint with. ``admin_url(pod_ip)`` is where a relay's admin API answers."""

    def __init__(self, custom_api: Any, core_api: Any, keys: dict[int, bytes], key_id: int, *,
                 namespace: str = "default", fleet: str = "relay", counter: str = "rooms",
                 release: Optional[str] = None, admin_token: Optional[str] = None, admin_port: int = ADMIN_PORT,
                 token_ttl: float = 60.0, request_timeout: float = 5.0):
        if key_id not in keys:
            raise ValueError(f"key id {key_id}: not among the keys given")
        self.custom_api = custom_api
        self.core_api = core_api
        self.keys, self.key_id = keys, key_id
        self.namespace, self.fleet, self.counter = namespace, fleet, counter
        self.release = release
        self.admin_token = admin_token
        self.admin_port = admin_port
        self.token_ttl = token_ttl
        self.request_timeout = request_timeout

    def allocate_match(self, players: list[str], room: Optional[str] = None,
                       options: Optional[dict] = None) -> Match:
        if not players or len(set(players)) != len(players):
            raise ValueError("players: a non-empty list of distinct names")
        room = room or new_room_name()
        status = self._allocate(room, players, options)
        pod = self.core_api.read_namespaced_pod(status["gameServerName"], self.namespace)
        self._create_room(pod.status.pod_ip, room, {"capacity": len(players), **(options or {})})
        game = next(port["port"] for port in status["ports"] if port["name"] == "game")
        match = Match(room, status["gameServerName"], status["address"], int(game))
        for player in players:
            token = mint_token(self.keys[self.key_id], self.key_id, room, player, self.token_ttl)
            match.tokens[player] = token.encode()
            match.expires = token.expires
        return match

    def _allocate(self, room: str, players: list[str], options: Optional[dict]) -> dict:
        body = allocation_body(self.fleet, room, players, self.counter, options, self.release)
        for attempt in range(CONTENTION_RETRIES):
            result = self.custom_api.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, body)
            status = result.get("status") or {}
            state = status.get("state")
            if state == "Allocated":
                return status
            if state != "Contention":
                raise NoCapacity(f"no relay of fleet {self.fleet} has a free room slot ({state})")
            time.sleep(0.05 * (attempt + 1))    # another allocation won the same relay
        raise NoCapacity(f"allocation contention on fleet {self.fleet}; try again")

    def _create_room(self, pod_ip: str, room: str, options: dict) -> dict:
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        request = urllib.request.Request(
            f"http://{host}:{self.admin_port}/rooms", method="POST",
            data=json.dumps({"room": room, "allocated": True, **options}).encode(),
            headers={"Content-Type": "application/json",
                     **({"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {})})
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"relay {pod_ip}: POST /rooms: HTTP {error.code} "
                               f"{error.read()[:200]!r}") from None


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Allocate a room for one match on relays "
                                                 "under Agones and print what the players need.")
    parser.add_argument("--players", required=True, help="comma-separated player names")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--fleet", default="relay")
    parser.add_argument("--release", help="prefer relays of this release (the Fleet template's "
                                          "app.kubernetes.io/version label)")
    parser.add_argument("--keys-file", help="the relays' token keys (TOML ID = \"BASE64KEY\")")
    parser.add_argument("--admin-token-file", help="the relays' admin API bearer token")
    parser.add_argument("--ttl", type=float, default=60.0, help="token lifetime, seconds")
    args = parser.parse_args(argv)
    try:
        keys, key_id = minting_keys(None, args.keys_file, None)
    except ConfigError as error:
        print(f"allocator: {error}", file=sys.stderr)
        return 2
    admin_token = None
    if args.admin_token_file:
        with open(args.admin_token_file) as handle:
            admin_token = handle.read().strip()
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    allocator = Allocator(client.CustomObjectsApi(), client.CoreV1Api(), keys, key_id,
                          namespace=args.namespace, fleet=args.fleet, release=args.release,
                          admin_token=admin_token,
                          token_ttl=args.ttl)
    players = [name for name in args.players.split(",") if name]
    try:
        match = allocator.allocate_match(players)
    except NoCapacity as error:
        print(f"allocator: {error}", file=sys.stderr)
        return 1
    print(json.dumps(match.as_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
