"""The relay's errors, in one place.

``RelayError`` is what the relay refuses, to an admin API caller (with an HTTP status) or to a
client SDK user (a refused join, a lost connection: ``relay.client`` raises it); ``code`` is a
stable machine-readable name, the message says why for a person. ``ConfigError`` is an invalid
setting, from the protocol core's settings or the relay's; ``ProtocolError``
(``relay.protocol``) a malformed message.
"""
from relay_core.config import ConfigError

__all__ = ["ConfigError", "Conflict", "NotFound", "RelayError", "Unavailable"]


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
