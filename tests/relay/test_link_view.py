"""What the relay shows of its players' links (issue #23, item 3): GET /rooms/{room} carries each
connected player's link with its redundancy controller's view, and the stats pass publishes the
peers by controller mode and the spurious resends."""
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
                assert link["mode"] in ("clean", "lossy", "bursty", "congested")
                assert isinstance(link["copying"], bool) and link["copying"] == (link["mode"] != "clean")
                assert link["burst_length"] >= 1.0 and 0 <= link["min_rtt_ms"] <= link["rtt_ms"] + 50
                assert link["queue_delay_ms"] >= 0
            server._sync_stats()
            text = server.metrics.render()[0].decode()
            for mode in ("clean", "lossy", "bursty", "congested", "always"):
                count = sum(link["mode"] == mode for link in links)
                assert f'relay_peers_redundancy{{mode="{mode}"}} {float(count)}' in text
            assert "relay_spurious_resends_total 0.0" in text
            # A player who left has no link.
            await players[1].client.close()
            await asyncio.sleep(0.3)
            assert "link" not in server.room_info("links")["players"][1]

    asyncio.run(main())
