"""benchmarks/tick_misses.py counts the server's simulated cache misses per player-tick under
callgrind (shape only, no figure is judged), and reads callgrind_annotate's table."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.tick_misses import parse_annotate, readable, summarize

ROOT = Path(__file__).resolve().parents[2]

TABLE = """\
--------------------------------------------------------------------------------
Ir                 D1mr            D1mw            DLmr            DLmw
--------------------------------------------------------------------------------
1,000 (100.0%) 300 (100.0%) 100 (100.0%) 60 (100.0%) 20 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                 D1mr            D1mw            DLmr            DLmw             file:function
--------------------------------------------------------------------------------
600 200 50 40 10  relay_core/peer.c:__pyx_f_10relay_core_4peer_4Peer_flush [{root}/relay_core/peer.so]
300 (30.0%)  80 (26.7%) 50 15 10  Objects/obmalloc.c:_PyObject_Malloc [/usr/lib/libpython3.11.so.1.0]
100 (10.0%)  20 ( 6.7%)   .         5 ( 8.3%)   .         /usr/include/x.h:__pyx_f_10relay_core_4peer_4Peer_flush
"""


def test_the_table_is_read_per_function_with_its_module():
    totals, rows = parse_annotate(TABLE.format(root=ROOT))
    assert totals == [1000, 300, 100, 60, 20]
    assert [(function, module) for _, function, module in rows] == [
        ("__pyx_f_10relay_core_4peer_4Peer_flush", "relay_core.peer"),
        ("_PyObject_Malloc", "python"),
        # A row without its object takes the one another row of the function names.
        ("__pyx_f_10relay_core_4peer_4Peer_flush", "relay_core.peer")]
    summary = summarize(totals, rows, player_ticks=10, top=5)
    assert summary["ll_misses"] == 8.0 and summary["instructions"] == 100.0
    assert summary["ll_misses_by_module"] == {"relay_core.peer": 5.5, "python": 2.5}
    assert summary["ll_misses_by_function"][0] == (
        "relay_core.peer", "__pyx_f_10relay_core_4peer_4Peer_flush", 5.5)


def test_cython_names_read_as_class_and_method():
    assert readable("__pyx_f_10relay_core_4peer_4Peer_flush") == "Peer.flush"
    assert readable("__pyx_pw_10relay_core_8endpoint_8Endpoint_17receive_batch") == "Endpoint.receive_batch"
    assert readable("__pyx_f_10relay_core_10redundancy_link_rtt") == "redundancy.link_rtt"
    assert readable("_PyObject_Malloc") == "_PyObject_Malloc"


def test_tick_misses_smoke_run_counts_the_servers_misses_per_player_tick(tmp_path):
    out = tmp_path / "misses.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tick_misses.py"), "--players", "16",
         "--ticks", "2", "--warmup", "3", "--top", "5", "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert figures["player_ticks"] == 16 * 2
    assert figures["path"] == "in-place"        # the server's own receive and flush
    assert figures["instructions"] > 1000 and figures["ll_misses"] > 0
    assert abs(figures["ll_misses"] - figures["ll_read_misses"] - figures["ll_write_misses"]) < 1e-9
    assert "relay_core.peer" in figures["ll_misses_by_module"]
    assert len(figures["ll_misses_by_function"]) == 5
    assert "frames short 0" in result.stdout and "LL misses per player-tick" in result.stdout
