"""Token mode, open mode and admin authentication of the relay, through real sockets on
loopback: a token-mode relay admits a client with a good token and refuses expired, reused,
tampered, unknown-key and wrong-room/player tokens with the reason visible to the client and
counted in /metrics; the admin API demands its bearer token where it must."""
from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from relay.client import RelayClient, RelayError
from relay.config import ConfigError, load_config
from relay.server.http import create_app
from relay.server.metrics import Metrics
from relay.server import RelayServer
from relay_core.token import ConnectToken, generate_key, mint_token

REPO = Path(__file__).resolve().parents[2]
KEY_1, KEY_2 = generate_key(), generate_key()
ADMIN_TOKEN = "s3cret-admin-token-0123456789"


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


def config(tmp_path, **environ):
    base = {"RELAY_SERVER_UDP_HOST": "127.0.0.1", "RELAY_SERVER_UDP_PORT": "0",
            "RELAY_SERVER_HTTP_PORT": "0", "RELAY_REPLAY_ENABLED": "false",
            "RELAY_REPLAY_DIRECTORY": str(tmp_path / "replays"),
            # Explicitly token mode: on loopback "auto" would be open.
            "RELAY_SECURITY_MODE": "token", "RELAY_SECURITY_KEYS": f"1:{b64(KEY_1)}"}
    base.update(environ)
    return load_config(environ={k: v for k, v in base.items() if v is not None})


@contextlib.asynccontextmanager
async def relay(tmp_path, **environ):
    server = RelayServer(config(tmp_path, **environ))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def scrape(server: RelayServer) -> dict:
    """{(sample name, labels): value} from the relay's /metrics, after a stats sync."""
    server._sync_stats()
    body, _ = server.metrics.render()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples}


def token(room="arena", player="alice", ttl=30.0, key=KEY_1, key_id=1, **kwargs) -> ConnectToken:
    return mint_token(key, key_id, room, player, ttl, **kwargs)


async def refusal(server, **kwargs) -> RelayError:
    host, port = server.udp_address
    with pytest.raises(RelayError) as caught:
        await RelayClient.connect(host, port, timeout=3, **kwargs)
    return caught.value


def run(coroutine):
    return asyncio.run(coroutine)


# -- token mode over real sockets ---------------------------------------------------------------

@pytest.mark.parametrize("encrypt", ["true", "false"])
def test_clients_with_good_tokens_join_and_play(tmp_path, encrypt):
    async def scenario():
        async with relay(tmp_path, RELAY_SECURITY_ENCRYPT_PACKETS=encrypt,
                         RELAY_ROOMS_START_PLAYERS="2") as server:
            host, port = server.udp_address
            # The backend hands out text; the SDK takes text or a ConnectToken, and the room and
            # player come from the token.
            alice = await RelayClient.connect(host, port, token=token(player="alice").encode())
            bob = await RelayClient.connect(host, port, token=token(player="bob"))
            assert (alice.room, alice.player) == ("arena", "alice")
            await alice.wait_for_state("running")

            async def play(client, frames=12):
                seen = []
                for ahead in range(2):
                    client.send_input(ahead, client.player.encode())
                while len(seen) < frames:
                    frame = await client.next_frame_or_none(timeout=3)
                    assert frame is not None
                    seen.append(frame)
                    client.send_input(frame.number + 2, client.player.encode())
                return seen

            alice_frames, bob_frames = await asyncio.gather(play(alice), play(bob))
            assert [frame.number for frame in alice_frames] == list(range(12))
            assert alice_frames == bob_frames
            # Inputs went through the (encrypted) session both ways.
            assert any(set(frame.inputs) >= {b"alice", b"bob"} for frame in alice_frames)
            metrics = scrape(server)
            assert metrics[("relay_security_open_mode", ())] == 0
            assert metrics[("relay_joins_total", (("outcome", "joined"),))] == 2
            await alice.close()
            await bob.close()
    run(scenario())


def test_expired_used_tampered_and_unknown_key_tokens_are_refused_visibly_and_counted(tmp_path):
    async def scenario():
        async with relay(tmp_path) as server:
            expired = token(ttl=5, now=time.time() - 60)
            assert (await refusal(server, token=expired)).code == "token_expired"

            good = token(player="carol")
            host, port = server.udp_address
            carol = await RelayClient.connect(host, port, token=good)
            error = await refusal(server, token=good)         # single use
            assert error.code == "token_used" and "single-use" in str(error)

            forged = bytearray(token(player="dave").private)
            forged[-1] ^= 0x01                                    # one flipped bit of the tag
            original = token(player="dave")
            tampered = ConnectToken(bytes(forged), original.client_key, original.server_key,
                                    original.room, original.player, original.expires)
            assert (await refusal(server, token=tampered)).code == "token_invalid"

            unknown = token(player="erin", key=KEY_2, key_id=2)  # a key this relay lacks
            assert (await refusal(server, token=unknown)).code == "token_invalid"

            # No token at all, to a relay that requires one.
            assert (await refusal(server, room="arena", player="frank")).code == "token_required"

            metrics = scrape(server)
            counted = {reason: metrics[("relay_handshake_refusals_total", (("reason", reason),))]
                       for reason in ("token_expired", "token_used", "token_invalid", "token_required")}
            assert counted == {"token_expired": 1, "token_used": 1, "token_invalid": 2,
                               "token_required": 1}
            await carol.close()
    run(scenario())


def test_a_join_must_name_the_tokens_room_and_player(tmp_path):
    async def scenario():
        async with relay(tmp_path) as server:
            error = await refusal(server, token=token(room="arena", player="alice"), room="other")
            assert error.code == "wrong_room" and "arena" in str(error)
            error = await refusal(server, token=token(room="arena", player="alice"), player="mallory")
            assert error.code == "wrong_player" and "alice" in str(error)
            metrics = scrape(server)
            assert metrics[("relay_join_refusals_total", (("reason", "wrong_room"),))] == 1
            assert metrics[("relay_join_refusals_total", (("reason", "wrong_player"),))] == 1
            assert "other" not in server.rooms           # a refused JOIN creates no room
    run(scenario())


def test_key_rotation_accepts_every_configured_key_id(tmp_path):
    async def scenario():
        keys = f"1:{b64(KEY_1)},2:{b64(KEY_2)}"
        async with relay(tmp_path, RELAY_SECURITY_KEYS=keys) as server:
            host, port = server.udp_address
            old = await RelayClient.connect(host, port, token=token(player="old"))
            new = await RelayClient.connect(host, port, token=token(player="new", key=KEY_2, key_id=2))
            await old.close()
            await new.close()
        # Key 1 retired: its tokens stop working, key 2's still work.
        async with relay(tmp_path, RELAY_SECURITY_KEYS=f"2:{b64(KEY_2)}") as server:
            assert (await refusal(server, token=token(player="old"))).code == "token_invalid"
            host, port = server.udp_address
            client = await RelayClient.connect(host, port, token=token(player="new", key=KEY_2, key_id=2))
            await client.close()
    run(scenario())


def test_a_reconnect_needs_a_fresh_token(tmp_path):
    async def scenario():
        async with relay(tmp_path, RELAY_ROOMS_START_PLAYERS="1") as server:
            host, port = server.udp_address
            client = await RelayClient.connect(host, port, token=token(player="alice"))
            with pytest.raises(RelayError) as caught:
                await client.reconnect(timeout=3)               # the same token again
            assert caught.value.code == "token_used"
            await client.reconnect(timeout=3, token=token(player="alice"))
            assert client.connected and client.welcome is not None
            await client.close()
    run(scenario())


def test_an_open_relay_refuses_tokens_and_says_so(tmp_path):
    async def scenario():
        async with relay(tmp_path, RELAY_SECURITY_MODE="auto", RELAY_SECURITY_KEYS=None) as server:
            assert server.security_mode == "open"                # auto on loopback
            assert (await refusal(server, token=token())).code == "token_unsupported"
            host, port = server.udp_address
            client = await RelayClient.connect(host, port, "arena", "anyone")
            assert scrape(server)[("relay_security_open_mode", ())] == 1
            await client.close()
    run(scenario())


def test_handshake_floods_from_one_address_are_rate_limited_and_counted(tmp_path):
    async def scenario():
        async with relay(tmp_path, RELAY_SECURITY_HANDSHAKE_RATE="1",
                         RELAY_SECURITY_HANDSHAKE_BURST="2") as server:
            host, port = server.udp_address
            # Eight clients retrying at once from 127.0.0.1: the budget admits a few packets.
            attempts = [RelayClient.connect(host, port, token=token(player=f"p{i}"), timeout=0.6)
                        for i in range(8)]
            results = await asyncio.gather(*attempts, return_exceptions=True)
            for result in results:
                if isinstance(result, RelayClient):
                    await result.close()
            assert any(isinstance(result, RelayError) for result in results)
            assert scrape(server)[("relay_dropped_datagrams_total", (("reason", "rate_limited"),))] > 0
    run(scenario())


# -- refusing to start unsafely -----------------------------------------------------------------

def test_token_mode_without_keys_refuses_to_start_saying_what_to_set(tmp_path):
    with pytest.raises(ConfigError) as caught:
        RelayServer(config(tmp_path, RELAY_SECURITY_KEYS=None))
    assert "RELAY_SECURITY_KEYS" in str(caught.value) and "keys_file" in str(caught.value)


def _serve(environ: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env.update(environ)
    return subprocess.run([sys.executable, "-m", "relay.cli", "serve"], capture_output=True,
                          text=True, timeout=30, cwd=REPO, env=env)


def test_relay_serve_on_a_public_address_without_keys_exits_2():
    # Refused before any socket is bound.
    result = _serve({"RELAY_SERVER_UDP_HOST": "0.0.0.0"})
    assert result.returncode == 2, result.stderr
    assert "token keys" in result.stderr and "relay token keygen" in result.stderr
    assert "Traceback" not in result.stderr


def test_relay_serve_with_a_public_admin_api_and_no_admin_token_exits_2():
    result = _serve({"RELAY_SERVER_HTTP_HOST": "0.0.0.0"})
    assert result.returncode == 2, result.stderr
    assert "RELAY_SECURITY_ADMIN_TOKEN" in result.stderr and "Traceback" not in result.stderr


def test_open_mode_on_a_public_address_is_allowed_but_flagged(tmp_path):
    server = RelayServer(config(tmp_path, RELAY_SERVER_UDP_HOST="0.0.0.0", RELAY_SECURITY_MODE="open",
                                RELAY_SECURITY_KEYS=None))
    assert server.security_mode == "open"
    assert server.metrics.security_open_mode._value.get() == 1      # not started: nothing bound


# -- admin API authentication -------------------------------------------------------------------

class Server:
    """What the admin routes call, minimal."""

    def health(self):
        return {"status": "ok"}

    def ready(self):
        return True

    def list_rooms(self):
        return []

    def drain(self):
        return {"draining": True}


@contextlib.asynccontextmanager
async def admin_client(**auth):
    metrics = Metrics(process=False, platform=False)
    async with TestClient(TestServer(create_app(Server(), metrics, **auth))) as client:
        client.metrics = metrics
        yield client


def test_non_loopback_rules_demand_the_bearer_token_on_admin_routes_only():
    async def scenario():
        async with admin_client(admin_token=ADMIN_TOKEN, require_auth=True) as client:
            missing = await client.get("/rooms")
            assert missing.status == 401
            assert missing.headers["WWW-Authenticate"].startswith("Bearer")
            assert (await missing.json())["error"] == "unauthorized"
            for header in ("Basic dXNlcjpwYXNz", "Bearer", "Bearer   ", ADMIN_TOKEN):
                malformed = await client.get("/rooms", headers={"Authorization": header})
                assert malformed.status == 401, header
                assert "Bearer" in malformed.headers["WWW-Authenticate"]
            wrong = await client.post("/admin/drain", headers={"Authorization": "Bearer nope"})
            assert wrong.status == 403 and (await wrong.json())["error"] == "forbidden"
            near = await client.get("/rooms", headers={"Authorization": f"Bearer {ADMIN_TOKEN}x"})
            assert near.status == 403
            good = await client.get("/rooms", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            assert good.status == 200 and await good.json() == {"rooms": []}
            scheme_case = await client.post("/admin/drain",
                                            headers={"Authorization": f"bearer {ADMIN_TOKEN}"})
            assert scheme_case.status == 200
            # Probes and scrapes stay open.
            for path in ("/health", "/ready", "/metrics"):
                assert (await client.get(path)).status == 200, path
            failures = client.metrics.admin_auth_failures
            assert failures.labels("missing")._value.get() == 1
            assert failures.labels("malformed")._value.get() == 4
            assert failures.labels("wrong")._value.get() == 2
    run(scenario())


def test_loopback_admin_api_is_open_without_a_token_and_enforced_with_one():
    async def scenario():
        async with admin_client() as client:
            assert (await client.get("/rooms")).status == 200
        async with admin_client(admin_token=ADMIN_TOKEN) as client:
            assert (await client.get("/rooms")).status == 401
            ok = await client.get("/rooms", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            assert ok.status == 200
    run(scenario())


def test_non_loopback_rules_without_a_token_refuse_to_build_the_app():
    with pytest.raises(ValueError, match="admin token"):
        create_app(Server(), Metrics(process=False, platform=False), require_auth=True)


def test_the_running_relay_enforces_a_configured_admin_token(tmp_path):
    token_file = tmp_path / "admin-token"
    token_file.write_text(ADMIN_TOKEN + "\n")

    async def scenario():
        async with relay(tmp_path, RELAY_SECURITY_MODE="open", RELAY_SECURITY_KEYS=None,
                         RELAY_SECURITY_ADMIN_TOKEN_FILE=str(token_file)) as server:
            base = f"http://127.0.0.1:{server.http_port}"

            def get(path, token=None):
                request = urllib.request.Request(base + path)
                if token:
                    request.add_header("Authorization", f"Bearer {token}")
                try:
                    with urllib.request.urlopen(request, timeout=5) as response:
                        return response.status, json.loads(response.read() or b"null") \
                            if path != "/metrics" else None
                except urllib.error.HTTPError as error:
                    return error.code, json.loads(error.read())

            loop = asyncio.get_running_loop()
            assert (await loop.run_in_executor(None, get, "/rooms"))[0] == 401
            assert (await loop.run_in_executor(None, get, "/rooms", "wrong-token-0000000"))[0] == 403
            assert (await loop.run_in_executor(None, get, "/rooms", ADMIN_TOKEN)) == (200, {"rooms": []})
            assert (await loop.run_in_executor(None, get, "/health"))[0] == 200
            assert (await loop.run_in_executor(None, get, "/metrics"))[0] == 200
    run(scenario())
