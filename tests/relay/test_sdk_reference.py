"""docs/CLIENT_SDK.md against relay.client: every SDK name the reference mentions exists, with
the kind it is documented as, and every public name of the SDK is documented."""
from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

import relay.client
from relay.client import (
    HANDSHAKE_REFUSALS, ClientStats, InputDelayAdvice, RelayClient, RelayError,
)
from relay.protocol import EVENT_KINDS, Frame, Welcome

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "CLIENT_SDK.md").read_text()


def _client() -> RelayClient:
    """A client that has not connected: it has every instance attribute, and needs no relay."""
    return RelayClient("127.0.0.1", 7777, room="doc", player="reader")


CLASSES = {
    "RelayClient": _client(), "client": _client(),
    "Frame": Frame, "frame": Frame,
    "Welcome": Welcome, "client.welcome": Welcome,
    "ClientStats": ClientStats, "client.stats()": ClientStats,
    "InputDelayAdvice": InputDelayAdvice, "client.input_delay_advice": InputDelayAdvice,
    "RelayError": RelayError, "client.error": RelayError,
}
"""What a name before a dot stands for in the reference."""


def _has(owner, name: str) -> bool:
    if dataclasses.is_dataclass(owner) and name in {f.name for f in dataclasses.fields(owner)}:
        return True
    return hasattr(owner, name)


def _code() -> list[str]:
    """The reference's code: inline code spans and fenced blocks."""
    blocks = re.findall(r"```\w*\n(.*?)```", DOC, re.S)
    prose = re.sub(r"```\w*\n.*?```", "", DOC, flags=re.S)
    return blocks + re.findall(r"`([^`\n]+)`", prose)


def _qualified_names() -> set[tuple[str, str]]:
    """(owner, attribute) for every ``owner.attribute`` in the reference's code, owners as in
    CLASSES (the longest match: ``client.welcome.slot`` is Welcome's ``slot``)."""
    owners = sorted(CLASSES, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, owners)) + r")\.([A-Za-z_]\w*)")
    found = set()
    for code in _code():
        for match in pattern.finditer(code):
            found.add((match.group(1), match.group(2)))
    return found


def _tables() -> list[tuple[str, list[list[str]]]]:
    """(first header cell, rows as lists of cells) of every table in the reference."""
    tables = []
    for block in re.findall(r"((?:^\|.*\|\n)+)", DOC, re.M):
        lines = block.strip("\n").split("\n")
        cells = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]
        tables.append((cells[0][0], cells[2:]))
    return tables


def _table(header: str) -> list[list[str]]:
    matches = [rows for first, rows in _tables() if first == header]
    assert len(matches) == 1, f"expected one table headed {header!r}"
    return matches[0]


def _first_column_names(rows: list[list[str]]) -> list[str]:
    return [name for row in rows for name in re.findall(r"`(\w+)", row[0])]


def test_every_qualified_name_exists():
    names = _qualified_names()
    assert ("client", "frames") in names and ("frame", "number") in names    # the scan works
    missing = sorted(f"{owner}.{name}" for owner, name in names
                     if not _has(CLASSES[owner], name))
    assert missing == [], f"docs/CLIENT_SDK.md names what does not exist: {missing}"


@pytest.mark.parametrize("header, owner", [
    ("`RelayClient` attribute", CLASSES["client"]), ("`Welcome` field", Welcome),
    ("`Frame` field", Frame), ("`InputDelayAdvice` field", InputDelayAdvice),
    ("`ClientStats` field", ClientStats),
])
def test_attribute_tables_name_what_exists(header, owner):
    names = _first_column_names(_table(header))
    assert names and [name for name in names if not _has(owner, name)] == []
    if dataclasses.is_dataclass(owner):     # and each record's table is complete
        assert sorted(names) == sorted(f.name for f in dataclasses.fields(owner))


def test_connect_parameters_are_the_documented_ones():
    documented = _first_column_names(_table("`RelayClient.connect` parameter"))
    connect = [name for name in inspect.signature(RelayClient.connect).parameters]
    assert documented == connect
    init = [name for name in inspect.signature(RelayClient).parameters]
    assert init == [name for name in connect if name != "timeout"]   # "the same except timeout"


def test_every_public_name_of_the_sdk_is_documented():
    spans = set(re.findall(r"`([^`\n]+)`", DOC))
    words = {word for span in spans for word in re.findall(r"[A-Za-z_]\w*", span)}
    public = {name for name in dir(_client()) if not name.startswith("_")}
    assert sorted(public - words) == []
    assert sorted(set(relay.client.__all__) - words) == []


def test_event_kinds_and_refusal_codes_are_complete():
    assert _first_column_names(_table("kind")) == list(EVENT_KINDS)
    codes = " ".join(row[0] for row in _table("code"))
    assert [code for code in HANDSHAKE_REFUSALS if f"`{code}`" not in codes] == []


def test_end_reasons_are_the_relays():
    reasons = _first_column_names(_table("`end_reason`"))
    assert reasons == ["empty", "admin", "draining", "drain_deadline", "shutdown"]
    source = "".join(path.read_text() for path in (ROOT / "relay" / "server").glob("*.py"))
    for reason in reasons:
        assert f'"{reason}"' in source, reason
