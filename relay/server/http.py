"""The relay's HTTP side: health and readiness probes, ``/metrics``, and the admin API.

Everything is JSON in and out. Every error — a refusal from the server (``RelayError``), a bad
request body, an unknown route, a wrong method, an unexpected exception — is answered as
``{"error": code, "message": text}`` with the matching status; exceptions are logged on
``relay.server.http`` and never shown to the client.

Routes::

    GET    /health                -> 200 server.health()
    GET    /ready                 -> 200 {"ready": true} | 503 {"ready": false}
    GET    /metrics               -> Prometheus text exposition
    GET    /rooms                 -> 200 {"rooms": [...]}
    POST   /rooms                 {"room": id, "capacity"?, "start_policy"?, "start_players"?,
                                   "tick_rate"?} -> 201 room
    GET    /rooms/{room}          -> 200 room
    DELETE /rooms/{room}          optional {"reason": text} -> 200 (ends the room)
    POST   /rooms/{room}/start    -> 200
    POST   /rooms/{room}/kick     {"player": name} -> 200
    POST   /admin/drain           -> 200

The server's methods are synchronous and run on the event loop thread, like the rest of the
relay; they must not block.

Authentication: when the listener is not loopback-only, or an admin token is configured, every
route except /health, /ready and /metrics needs ``Authorization: Bearer <admin token>``:
401 (with ``WWW-Authenticate: Bearer``) when the header is missing or malformed, 403 when the
token is wrong.
"""
from __future__ import annotations

import hmac
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, NoReturn

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from relay.errors import RelayError
from relay.server.lobby import ROOM_OPTION_TYPES
from relay.protocol import MAX_NAME_LENGTH

if TYPE_CHECKING:
    from relay.server.metrics import Metrics

log = logging.getLogger("relay.server.http")

MAX_BODY_SIZE = 64 * 1024
MAX_REASON_LENGTH = 256


PUBLIC_ROUTES = frozenset({"health", "ready", "metrics"})
"""Route names that stay open when admin authentication exists (probes and scrapes)."""

SERVER_KEY = web.AppKey("server", object)
# Typed by annotation: their classes are defined below (AdminAuth) or imported only for typing.
METRICS_KEY: web.AppKey[Metrics] = web.AppKey("metrics")
AUTH_KEY: web.AppKey[AdminAuth] = web.AppKey("auth")

AUTH_LOG_INTERVAL = 10.0
"""Seconds between log lines about refused admin requests (each one is counted)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BadRequest(RelayError):
    """A request body or parameter the API cannot use."""

    status = 400
    code = "bad_request"


# -- errors ------------------------------------------------------------------------------------

def error_response(status: int, code: str, message: str,
                   headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": code, "message": message}, status=status, headers=headers)


def _http_error_code(status: int, reason: str) -> str:
    """``404 Not Found`` -> ``not_found``, ``405 Method Not Allowed`` -> ``method_not_allowed``."""
    return "_".join(reason.lower().replace("-", " ").split()) or f"http_{status}"


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every way a request can fail into a JSON error body."""
    try:
        return await handler(request)
    except RelayError as error:
        return error_response(error.status, error.code, str(error))
    except web.HTTPException as error:
        if error.status < 400:          # redirects and the like pass through unchanged
            raise
        headers = {name: value for name, value in error.headers.items()
                   if name.lower() in ("allow", "retry-after", "www-authenticate")}
        message = error.reason
        code = _http_error_code(error.status, error.reason)
        if error.status in (401, 403):
            code = "unauthorized" if error.status == 401 else "forbidden"
        elif error.status == 405:
            message = f"method {request.method} not allowed; allowed: {headers.get('Allow', '')}"
        elif error.status == 404:
            message = f"no route for {request.path}"
        elif error.status == 413:
            message = f"request body larger than {MAX_BODY_SIZE} bytes"
        return error_response(error.status, code, message, headers)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, "internal", "internal server error")


# -- authentication ----------------------------------------------------------------------------

class AdminAuth:
    """The admin bearer token and whether it is demanded; counts and logs refusals."""

    def __init__(self, token: str | None, required: bool, metrics: Any = None):
        if required and not token:
            raise ValueError("the admin API requires authentication here but no admin token "
                             "is configured (security.admin_token_file or RELAY_SECURITY_ADMIN_TOKEN)")
        self.required = required or bool(token)
        self._token = token.encode() if token else b""
        self._metrics = metrics
        self._last_log = -AUTH_LOG_INTERVAL
        self._unlogged = 0

    def check(self, request: web.Request) -> None:
        """Raise 401/403 unless the request carries the admin token."""
        header = request.headers.get("Authorization")
        if header is None:
            self._refuse(request, 401, "missing", "this endpoint needs Authorization: Bearer <admin token>")
        scheme, _, credentials = header.partition(" ")
        credentials = credentials.strip()
        if scheme.lower() != "bearer" or not credentials:
            self._refuse(request, 401, "malformed", "malformed Authorization header; expected "
                                                    "Authorization: Bearer <admin token>")
        # Constant time: the comparison must not tell how much of a guess was right.
        if not hmac.compare_digest(credentials.encode("utf-8", "surrogateescape"), self._token):
            self._refuse(request, 403, "wrong", "wrong admin token")

    def _refuse(self, request: web.Request, status: int, reason: str, message: str) -> NoReturn:
        if self._metrics is not None:
            self._metrics.admin_auth_failures.labels(reason=reason).inc()
        now = time.monotonic()
        self._unlogged += 1
        if now - self._last_log >= AUTH_LOG_INTERVAL:
            log.warning("admin request refused (%s): %s %s from %s; %d refused since the last "
                        "such line", reason, request.method, request.path, request.remote,
                        self._unlogged)
            self._last_log, self._unlogged = now, 0
        headers = {"WWW-Authenticate": 'Bearer realm="relay-admin"'}
        if status == 401:
            if reason == "malformed":
                headers["WWW-Authenticate"] += ', error="invalid_request"'
            raise web.HTTPUnauthorized(reason=message, headers=headers)
        headers["WWW-Authenticate"] += ', error="invalid_token"'
        raise web.HTTPForbidden(reason=message, headers=headers)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Admin routes (every matched route not in ``PUBLIC_ROUTES``) need the bearer token when
    authentication is on. The error middleware, outside this one, turns the 401/403 into JSON;
    unknown routes and wrong methods have no route name and fall through to their 404/405."""
    auth: AdminAuth = request.app[AUTH_KEY]
    route_name = request.match_info.route.name
    if auth.required and route_name is not None and route_name not in PUBLIC_ROUTES:
        auth.check(request)
    return await handler(request)


# -- request parsing ---------------------------------------------------------------------------

def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def _json_body(request: web.Request, *, optional: bool = False) -> dict[str, Any]:
    """The request body as a JSON object; an empty body is ``{}`` when ``optional``."""
    raw = await request.read()
    if not raw.strip():
        if optional:
            return {}
        raise BadRequest("a JSON object body is required", code="bad_json")
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as error:   # UnicodeDecodeError is a ValueError
        raise BadRequest(f"the body is not valid JSON: {error}", code="bad_json") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object", code="bad_json")
    return body


def _check_keys(body: dict[str, Any], allowed: set[str] | frozenset[str] | dict) -> None:
    for key in body:
        if key not in allowed:
            raise BadRequest(f"unknown field {key!r}", code="unknown_field")


def _name(value: Any, what: str) -> str:
    """A room id or player name: a non-empty string of at most MAX_NAME_LENGTH characters."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME_LENGTH:
        raise BadRequest(f"{what} must be a string of 1..{MAX_NAME_LENGTH} characters",
                         code="bad_field")
    return value


def _typed(key: str, value: Any, kind: type) -> Any:
    # JSON true/false are Python bools, and bool is a subclass of int: refuse them for ints.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = {int: "an integer", str: "a string"}.get(kind, kind.__name__)
        raise BadRequest(f"{key} must be {expected}", code="bad_field")
    return value


def _room_param(request: web.Request) -> str:
    return _name(request.match_info["room"], "room")


# -- handlers ----------------------------------------------------------------------------------

def _server(request: web.Request) -> Any:
    return request.app[SERVER_KEY]


async def health(request: web.Request) -> web.Response:
    return web.json_response(_server(request).health())


async def ready(request: web.Request) -> web.Response:
    is_ready = bool(_server(request).ready())
    return web.json_response({"ready": is_ready}, status=200 if is_ready else 503)


async def serve_metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": content_type})


async def list_rooms(request: web.Request) -> web.Response:
    return web.json_response({"rooms": _server(request).list_rooms()})


async def create_room(request: web.Request) -> web.Response:
    body = await _json_body(request)
    _check_keys(body, {"room", *ROOM_OPTION_TYPES})
    if "room" not in body:
        raise BadRequest("room is required", code="bad_field")
    room_id = _name(body.pop("room"), "room")
    options = {key: _typed(key, value, ROOM_OPTION_TYPES[key]) for key, value in body.items()}
    return web.json_response(_server(request).create_room(room_id, **options), status=201)


async def room_info(request: web.Request) -> web.Response:
    return web.json_response(_server(request).room_info(_room_param(request)))


async def end_room(request: web.Request) -> web.Response:
    room_id = _room_param(request)
    body = await _json_body(request, optional=True)
    _check_keys(body, {"reason"})
    if "reason" in body:
        reason = body["reason"]
        if not isinstance(reason, str) or not 1 <= len(reason) <= MAX_REASON_LENGTH:
            raise BadRequest(f"reason must be a string of 1..{MAX_REASON_LENGTH} characters",
                             code="bad_field")
        return web.json_response(_server(request).end_room(room_id, reason=reason))
    return web.json_response(_server(request).end_room(room_id))


async def start_room(request: web.Request) -> web.Response:
    return web.json_response(_server(request).start_room(_room_param(request)))


async def kick(request: web.Request) -> web.Response:
    room_id = _room_param(request)
    body = await _json_body(request)
    _check_keys(body, {"player"})
    if "player" not in body:
        raise BadRequest("player is required", code="bad_field")
    player = _name(body["player"], "player")
    return web.json_response(_server(request).kick(room_id, player))


async def drain(request: web.Request) -> web.Response:
    return web.json_response(_server(request).drain())


# -- application -------------------------------------------------------------------------------

def create_app(server: Any, metrics: Any, *, admin_token: str | None = None,
               require_auth: bool = False) -> web.Application:
    """The aiohttp application serving ``server`` (see the module docstring for the routes)
    and ``metrics.render()`` at ``/metrics``. Admin routes need ``admin_token`` when it is set
    or ``require_auth`` (a listener beyond loopback); ``require_auth`` without a token raises
    ValueError."""
    app = web.Application(middlewares=[error_middleware, auth_middleware],
                          client_max_size=MAX_BODY_SIZE)
    app[SERVER_KEY] = server
    app[METRICS_KEY] = metrics
    app[AUTH_KEY] = AdminAuth(admin_token, require_auth, metrics)
    router = app.router
    router.add_get("/health", health, name="health")
    router.add_get("/ready", ready, name="ready")
    router.add_get("/metrics", serve_metrics, name="metrics")
    router.add_get("/rooms", list_rooms, name="list_rooms")
    router.add_post("/rooms", create_room, name="create_room")
    router.add_get("/rooms/{room}", room_info, name="room_info")
    router.add_delete("/rooms/{room}", end_room, name="end_room")
    router.add_post("/rooms/{room}/start", start_room, name="start_room")
    router.add_post("/rooms/{room}/kick", kick, name="kick")
    router.add_post("/admin/drain", drain, name="drain")
    return app


class AccessLog(AbstractAccessLogger):
    """One debug line per request: at info, a Prometheus scrape every few seconds would be most
    of the log. Fields as extras, so the structlog formatter renders them as keys."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.debug("http_request", extra={
            "method": request.method, "path": request.path, "status": response.status,
            "ms": round(time * 1000, 2), "remote": request.remote})

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.DEBUG)


async def start_http(server: Any, metrics: Any, host: str | None, port: int,
                     *, shutdown_timeout: float = 5.0, admin_token: str | None = None,
                     require_auth: bool | None = None) -> tuple[web.AppRunner, int]:
    """Serve the app on ``host:port`` (port 0 picks a free one); returns the runner, for
    ``stop_http``, and the port actually bound (of the first socket, if ``host`` resolves to
    several addresses). ``require_auth`` defaults to "``host`` is not loopback-only"."""
    if require_auth is None:
        from relay.config import is_loopback

        require_auth = host is None or not is_loopback(host)
    app = create_app(server, metrics, admin_token=admin_token, require_auth=require_auth)
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout, access_log_class=AccessLog)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_port = runner.addresses[0][1]
    log.info("http_listening", extra={"address": f"{host or '*'}:{bound_port}"})
    return runner, bound_port


async def stop_http(runner: web.AppRunner) -> None:
    """Stop listening and close connections, letting requests in flight finish (up to the
    runner's shutdown timeout)."""
    await runner.cleanup()
