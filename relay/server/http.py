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
                                   "tick_rate"?, "allocated"?} -> 201 room ("allocated": true:
                                   an Agones allocation already took the room's Counter slot)
    GET    /rooms/{room}          -> 200 room, each connected player with its "link": rtt_ms,
                                   loss, mode, burst_length, min_rtt_ms, queue_delay_ms,
                                   copying, resends, spurious_resends, redundant_bytes,
                                   bytes_sent (what its lag is made of)
    DELETE /rooms/{room}          optional {"reason": text} -> 200 (ends the room)
    POST   /rooms/{room}/start    -> 200
    POST   /rooms/{room}/kick     {"player": name} -> 200
    POST   /admin/drain           -> 200

The server's methods are synchronous and run on the event loop thread, like the rest of the
relay; they must not block.

Connections (``HttpGuard``): a connection must deliver a complete request head (request line
and headers) within ``server.http_header_timeout`` of opening or of its previous response, and a
request body within ``server.http_body_timeout`` (408); at most ``server.http_max_connections``
are open, and never so many that the process's file descriptors run into the reserve kept for
the UDP socket and replay files (``fd_budget``). A connection over those limits closes the
oldest connection that is waiting for a request head, or is refused (closed at once) when every
connection is busy in a handler. Closed and refused connections are counted in the log, one
line per kind and interval.

Authentication: when the listener is not loopback-only, or an admin token is configured, every
route except /health, /ready and /metrics needs ``Authorization: Bearer <admin token>``:
401 (with ``WWW-Authenticate: Bearer``) when the header is missing or malformed, 403 when the
token is wrong.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import resource
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, NoReturn, Optional, cast

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
GUARD_KEY: web.AppKey[HttpGuard] = web.AppKey("guard")

AUTH_LOG_INTERVAL = 10.0
"""Seconds between log lines about refused admin requests (each one is counted)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BadRequest(RelayError):
    """A request body or parameter the API cannot use."""

    status = 400
    code = "bad_request"


class RequestTimeout(RelayError):
    """A request body that did not arrive within the body timeout."""

    status = 408
    code = "request_timeout"


# -- connection guard --------------------------------------------------------------------------

DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 10.0

LINGER_TIME = 2.0
"""Longest a connection whose body was not read whole is drained before it closes, seconds."""

FD_RESERVE_MIN = 64
FD_RESERVE_FRACTION = 4
"""The HTTP side leaves max(FD_RESERVE_MIN, limit // FD_RESERVE_FRACTION) of the process's file
descriptors (soft RLIMIT_NOFILE) to everything else: the UDP socket, replay files being written,
log files, the Agones client."""

FD_LIMIT_TARGET = 65536
"""``raise_fd_limit`` raises the soft RLIMIT_NOFILE up to the hard limit, at most this."""


def fd_budget(limit: Optional[int] = None) -> tuple[int, int]:
    """(the soft RLIMIT_NOFILE, the descriptors reserved from it for all but HTTP)."""
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY or limit > 2**31:
        limit = 2**31
    return limit, max(FD_RESERVE_MIN, limit // FD_RESERVE_FRACTION)


def raise_fd_limit(target: int = FD_LIMIT_TARGET) -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE towards the hard limit (at most ``target``), as servers do:
    container runtimes and systemd often start processes at a soft 1024 under a far higher hard
    limit. Returns (soft limit before, soft limit now); never lowers it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (OSError, ValueError):
            return soft, soft
        return soft, wanted
    return soft, soft


def _default_limit_log() -> Callable[..., None]:
    from relay.logs import LimitLog, get_logger

    return LimitLog(get_logger("relay.server.http"))


class _GuardedConnection(asyncio.Protocol):
    """One accepted HTTP connection: aiohttp's request handler behind the guard, which admits
    or refuses it when it is accepted and closes it when a request head is late."""

    __slots__ = ("guard", "handler", "transport", "admitted", "busy", "timer")

    def __init__(self, guard: HttpGuard, handler: asyncio.Protocol):
        self.guard = guard
        self.handler = handler
        self.transport: Optional[asyncio.Transport] = None
        self.admitted = False
        self.busy = 0
        """Requests of this connection inside a handler (their heads are complete)."""
        self.timer: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)    # uvloop's is no subclass of it
        if self.guard.admit(self):
            self.admitted = True
            self.handler.connection_made(transport)
        else:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.admitted:
            self.handler.data_received(data)

    def eof_received(self) -> Optional[bool]:
        return self.handler.eof_received() if self.admitted else None

    def pause_writing(self) -> None:
        if self.admitted:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.handler.resume_writing()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.guard.release(self)
        if self.admitted:
            self.admitted = False
            self.handler.connection_lost(exc)


class HttpGuard:
    """What keeps the HTTP side from being starved (slowloris and the like):

    - a request head (request line and headers) must be complete within ``header_timeout`` of
      the connection opening or of its previous response (the handler finishing), else the
      connection is closed: total time, however slowly the bytes trickle in;
    - a request body must arrive within ``body_timeout`` (408 request_timeout);
    - at most ``max_connections`` connections, and none whose descriptor would take one of the
      reserved descriptors (``fd_budget``). A connection over either limit closes the oldest
      connection that waits for a request head (keep-alive idle or incomplete), so probes get
      through however many idle connections an attacker holds; when every connection is inside
      a handler, the new one is refused (closed at once).

    Accepting continues under attack (refused connections are closed, not left in the kernel's
    accept queue, where they would keep probes from being accepted). Closes and refusals are
    counted in ``counts`` and logged through ``limit_log`` (one line per kind and interval).
    """

    def __init__(self, *, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 header_timeout: float = DEFAULT_HEADER_TIMEOUT,
                 body_timeout: float = DEFAULT_BODY_TIMEOUT, fd_limit: Optional[int] = None,
                 limit_log: Optional[Callable[..., None]] = None):
        self.fd_limit, self.fd_reserve = fd_budget(fd_limit)
        self.fd_ceiling = self.fd_limit - self.fd_reserve
        """A new connection whose descriptor number is at or above this digs into the reserve
        (descriptors are allocated lowest first: descriptor n means n others are open)."""
        self.max_connections = max(1, min(max_connections, self.fd_ceiling))
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self._limit_log = limit_log
        self._open: dict[_GuardedConnection, None] = {}
        """Admitted connections still open, oldest first."""
        self._by_handler: dict[Any, _GuardedConnection] = {}
        self.counts: dict[str, int] = {}
        """Connections closed or refused, by reason (header_timeout, body_timeout,
        connection_limit, fd_reserve, all_busy)."""

    @property
    def connections(self) -> int:
        return len(self._open)

    def protocol_factory(self, make_handler: Callable[[], Any]) -> Callable[[], asyncio.Protocol]:
        return lambda: _GuardedConnection(self, make_handler())

    def _note(self, event: str, kind: str, **fields: Any) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self._limit_log is None:
            self._limit_log = _default_limit_log()
        self._limit_log(event, f"http_{kind}", **fields)

    def admit(self, connection: _GuardedConnection) -> bool:
        transport = connection.transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if fd >= self.fd_ceiling or len(self._open) >= self.max_connections:
            kind = "fd_reserve" if fd >= self.fd_ceiling else "connection_limit"
            victim = next((open_ for open_ in self._open if not open_.busy), None)
            if victim is None:
                self._note("http_connection_refused", "all_busy", connections=len(self._open),
                           limit=self.max_connections)
                return False
            self._note("http_connection_closed", kind, connections=len(self._open),
                       limit=self.max_connections, fd=fd, fd_limit=self.fd_limit,
                       detail="closed the oldest connection waiting for a request head")
            self._close(victim)
        self._open[connection] = None
        self._by_handler[connection.handler] = connection
        self._arm(connection)
        return True

    def release(self, connection: _GuardedConnection) -> None:
        self._open.pop(connection, None)
        self._by_handler.pop(connection.handler, None)
        if connection.timer is not None:
            connection.timer.cancel()
            connection.timer = None

    def _close(self, connection: _GuardedConnection) -> None:
        self.release(connection)        # at once: the same victim is not picked twice
        if connection.transport is not None:
            connection.transport.abort()

    def _arm(self, connection: _GuardedConnection) -> None:
        if connection.timer is not None:
            connection.timer.cancel()
        loop = asyncio.get_running_loop()
        connection.timer = loop.call_later(self.header_timeout, self._expire, connection)

    def _expire(self, connection: _GuardedConnection) -> None:
        connection.timer = None
        if not connection.busy and connection in self._open:
            self._note("http_connection_closed", "header_timeout",
                       timeout_s=self.header_timeout,
                       detail="no complete request head in time")
            self._close(connection)

    def request_started(self, request: web.BaseRequest) -> Optional[_GuardedConnection]:
        """A request head is complete (its handler starts): the header clock stops."""
        connection = self._by_handler.get(request.protocol)
        if connection is not None:
            connection.busy += 1
            if connection.timer is not None:
                connection.timer.cancel()
                connection.timer = None
        return connection

    def request_finished(self, connection: Optional[_GuardedConnection]) -> None:
        """The handler returned: the next request head is due within header_timeout."""
        if connection is not None:
            connection.busy -= 1
            if not connection.busy and connection in self._open:
                self._arm(connection)

    def body_timed_out(self, request: web.BaseRequest) -> None:
        self._note("http_request_refused", "body_timeout", timeout_s=self.body_timeout,
                   method=request.method, path=request.path)


class _GuardedSite(web.BaseSite):
    """A TCP listener whose connections go through an HttpGuard (aiohttp's TCPSite otherwise)."""

    __slots__ = ("_host", "_port", "_guard")

    def __init__(self, runner: web.BaseRunner, host: Optional[str], port: int, guard: HttpGuard,
                 *, backlog: int = 128):
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._guard = guard

    @property
    def name(self) -> str:
        return f"http://{self._host or '0.0.0.0'}:{self._port}"

    async def start(self) -> None:
        await super().start()
        make_handler = self._runner.server
        assert make_handler is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._guard.protocol_factory(make_handler),
                                                self._host, self._port, backlog=self._backlog)


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
        response = error_response(error.status, error.code, str(error))
        if error.status == 408:
            response.force_close()      # no further request on this connection
        return response
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


@web.middleware
async def guard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the connection guard when a request's handler runs: its head is complete, and the
    next one is due within the header timeout of the handler's end."""
    guard = request.app[GUARD_KEY]
    connection = guard.request_started(request)
    try:
        return await handler(request)
    finally:
        guard.request_finished(connection)


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
    guard = request.app[GUARD_KEY]
    try:
        async with asyncio.timeout(guard.body_timeout):
            raw = await request.read()
    except TimeoutError:
        guard.body_timed_out(request)
        raise RequestTimeout(f"the request body did not arrive within {guard.body_timeout:g} s") \
            from None
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
    _check_keys(body, {"room", "allocated", *ROOM_OPTION_TYPES})
    if "room" not in body:
        raise BadRequest("room is required", code="bad_field")
    room_id = _name(body.pop("room"), "room")
    allocated = _typed("allocated", body.pop("allocated", False), bool)
    options = {key: _typed(key, value, ROOM_OPTION_TYPES[key]) for key, value in body.items()}
    if allocated:
        return web.json_response(_server(request).create_room(room_id, allocated=True, **options),
                                 status=201)
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
               require_auth: bool = False, guard: Optional[HttpGuard] = None) -> web.Application:
    """The aiohttp application serving ``server`` (see the module docstring for the routes)
    and ``metrics.render()`` at ``/metrics``. Admin routes need ``admin_token`` when it is set
    or ``require_auth`` (a listener beyond loopback); ``require_auth`` without a token raises
    ValueError. ``guard`` bounds connections and body reads (default: an HttpGuard with the
    default limits, which only times bodies unless the app is served by ``start_http``)."""
    app = web.Application(middlewares=[error_middleware, guard_middleware, auth_middleware],
                          client_max_size=MAX_BODY_SIZE)
    app[SERVER_KEY] = server
    app[GUARD_KEY] = guard if guard is not None else HttpGuard()
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
                     require_auth: bool | None = None,
                     max_connections: int = DEFAULT_MAX_CONNECTIONS,
                     header_timeout: float = DEFAULT_HEADER_TIMEOUT,
                     body_timeout: float = DEFAULT_BODY_TIMEOUT,
                     limit_log: Optional[Callable[..., None]] = None) -> tuple[web.AppRunner, int]:
    """Serve the app on ``host:port`` (port 0 picks a free one) behind an HttpGuard with these
    limits; returns the runner, for ``stop_http``, and the port actually bound (of the first
    socket, if ``host`` resolves to several addresses). ``require_auth`` defaults to "``host``
    is not loopback-only"."""
    if require_auth is None:
        from relay.config import is_loopback

        require_auth = host is None or not is_loopback(host)
    guard = HttpGuard(max_connections=max_connections, header_timeout=header_timeout,
                      body_timeout=body_timeout, limit_log=limit_log)
    app = create_app(server, metrics, admin_token=admin_token, require_auth=require_auth,
                     guard=guard)
    # aiohttp's own keep-alive timer agrees with the guard's header clock; the unread rest of a
    # body (a 408, a handler that reads none) is drained for at most LINGER_TIME before closing.
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout, access_log_class=AccessLog,
                           keepalive_timeout=header_timeout,
                           lingering_time=min(LINGER_TIME, body_timeout))
    await runner.setup()
    try:
        site = _GuardedSite(runner, host, port, guard)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_port = runner.addresses[0][1]
    log.info("http_listening", extra={
        "address": f"{host or '*'}:{bound_port}", "max_connections": guard.max_connections,
        "fd_limit": guard.fd_limit, "fd_reserve": guard.fd_reserve})
    return runner, bound_port


async def stop_http(runner: web.AppRunner) -> None:
    """Stop listening and close connections, letting requests in flight finish (up to the
    runner's shutdown timeout)."""
    await runner.cleanup()
