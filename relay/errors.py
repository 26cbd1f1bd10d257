"""The relay's errors, in one place.

``RelayError`` is what the relay refuses, to an admin API caller (with an HTTP status) or to a
client SDK user (a refused join, a lost connection: ``relay.client`` raises it); ``code`` is a
stable machine-readable name, the message says why for a person. ``ConfigError`` is an invalid
setting, from the protocol core's settings or the relay's; ``ProtocolError``
(``relay.protocol``) a malformed message. ``ListenError`` is a listener the server could not
open (a port in use, a privileged port, an address not on this machine).
"""
import errno

from relay_core.config import ConfigError

__all__ = ["ConfigError", "Conflict", "ListenError", "NotFound", "RelayError", "Unavailable"]


_LISTEN_CAUSES = {
    errno.EADDRINUSE: "address already in use (another relay or program listens there)",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
    errno.EADDRNOTAVAIL: "address not available (it is not an address of this machine)",
}


class ListenError(Exception):
    """The server could not listen on ``host:port`` for ``kind`` ("udp": game traffic, "http":
    metrics and admin API). The message is one line naming the address, the cause and the
    setting to change (an address not on this machine: the host; otherwise the port)."""

    def __init__(self, kind: str, host: str, port: int, error: OSError):
        self.kind, self.host, self.port, self.errno = kind, host, port, error.errno
        cause = _LISTEN_CAUSES.get(error.errno or 0) or error.strerror or str(error)
        what = "host" if error.errno == errno.EADDRNOTAVAIL else "port"
        setting = f"server.{kind}_{what}"
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        label = "UDP (game traffic)" if kind == "udp" else "HTTP (metrics and admin API)"
        super().__init__(
            f"cannot listen for {label} on {address}: {cause}; change {setting} (environment "
            f"variable RELAY_{setting.upper().replace('.', '_')}, or --{kind}-{what})")


class RelayError(Exception):
    """Base: what the relay refuses; ``code`` is a stable machine-readable name."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code

    def to_dict(self) -> dict:
        return {"error": self.code, "message": str(self)}


class NotFound(RelayError):
    status = 404
    code = "not_found"


class Conflict(RelayError):
    status = 409
    code = "conflict"


class Unavailable(RelayError):
    """The relay is draining or stopping and takes no new work."""

    status = 503
    code = "unavailable"
