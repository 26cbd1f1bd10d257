"""Errors the relay reports to admin API callers and the CLI, with an HTTP status each."""


class RelayError(Exception):
    """Base: a request the relay refuses; ``code`` is a stable machine-readable name."""

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
