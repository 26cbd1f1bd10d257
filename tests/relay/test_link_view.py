"""What the relay shows of its players' links (issue #23, item 3): GET /rooms/{room} carries each
connected player's link, and the stats pass publishes the peers by redundancy state and the
spurious resends."""
from __future__ import annotations

import asyncio

from live_relay import running_room


def test_the_room_view_shows_each_players_link_and_metrics_count_peers_by_redundancy(tmp_path):
    async def main():
        async with running_room(tmp_path, "links", ["ann", "ben"], start_players=2) as (server, players):
            await asyncio.gather(*(p.play_until(20, timeout=5.0) for p in players))
            info = server.room_info("links")
            links = [player["link"] for player in info["players"]]
            assert len(links) == 2
            for link in links:
                assert 0 < link["rtt_ms"] < 1000 and 0 <= link["loss"] <= 1
                assert link["bytes_sent"] > 0 and link["spurious_resends"] <= link["resends"]
                assert isinstance(link["bad_mode"], bool) and isinstance(link["copying"], bool)
            server._sync_stats()
            text = server.metrics.render()[0].decode()
            copying = sum(link["copying"] for link in links)
            assert f'relay_peers_redundancy{{state="copying"}} {float(copying)}' in text
            assert 'relay_peers_redundancy{state="bad_mode"} 0.0' in text
            assert "relay_spurious_resends_total 0.0" in text
            # A player who left has no link.
            await players[1].client.close()
            await asyncio.sleep(0.3)
            assert "link" not in server.room_info("links")["players"][1]

    asyncio.run(main())
