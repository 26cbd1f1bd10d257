"""A stand-in for the Agones SDK sidecar (aiohttp) that records every call."""
import asyncio
import time

from aiohttp import web


class FakeSidecar:
    """The documented SDK REST endpoints; ``fail[path] = n`` answers the next n calls 500."""

    ROUTES = [("POST", "/ready"), ("POST", "/health"), ("POST", "/shutdown"),
              ("POST", "/allocate"), ("GET", "/gameserver"), ("PUT", "/metadata/label"),
              ("PUT", "/metadata/annotation"), ("POST", "/alpha/player/connect"),
              ("POST", "/alpha/player/disconnect"), ("PUT", "/alpha/player/capacity")]

    def __init__(self):
        self.calls = []          # (time, method, path, body)
        self.fail = {}
        self.fail_text = {}
        self.hang = {}           # path -> calls left that never answer (until release is set)
        self.release = asyncio.Event()
        self.runner = None
        self.port = None

    async def handle(self, request):
        body = await request.json() if request.can_read_body else None
        self.calls.append((time.monotonic(), request.method, request.path, body))
        if self.hang.get(request.path, 0) > 0:
            self.hang[request.path] -= 1
            await self.release.wait()
        if self.fail.get(request.path, 0) > 0:
            self.fail[request.path] -= 1
            return web.json_response(
                {"code": 2, "message": self.fail_text.get(request.path, "transient")}, status=500)
        if request.path == "/gameserver":
            return web.json_response({"object_meta": {"name": "gs-1"}, "status": {"state": "Ready"}})
        if request.path.startswith("/alpha/player/") and request.path != "/alpha/player/capacity":
            return web.json_response({"bool": True})
        return web.json_response({})

    async def start(self, port=0):
        app = web.Application()
        for method, path in self.ROUTES:
            app.router.add_route(method, path, self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port)
        await site.start()
        self.port = self.runner.addresses[0][1]
        return self

    async def stop(self):
        self.release.set()
        await self.runner.cleanup()

    def paths(self, path):
        return [c for c in self.calls if c[2] == path]

    def bodies(self, path):
        return [c[3] for c in self.calls if c[2] == path]

    def final(self, path):
        """key -> last value sent, for label/annotation calls."""
        return {body["key"]: body["value"] for body in self.bodies(path)}
