"""One error tree. Every error a client can cause or see maps to an OpenAI-shaped JSON body."""

from __future__ import annotations

from typing import Any

import orjson


class CtxProxyError(Exception):
    """Base of every error the proxy raises on purpose."""

    status = 500
    type = "server_error"
    code: str | None = None
    param: str | None = None

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if param is not None:
            self.param = param
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        error.update(self.extra)
        return {"error": error}

    def body_bytes(self) -> bytes:
        return orjson.dumps(self.body())


class ConfigError(CtxProxyError):
    """A config or policy file is invalid; the message names the file and the key."""


class BadRequest(CtxProxyError):
    status = 400
    type = "invalid_request_error"


class NotFound(CtxProxyError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class RequestTimeout(CtxProxyError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLarge(CtxProxyError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class ContextLengthExceeded(BadRequest):
    code = "context_length_exceeded"
    param = "messages"


class UpstreamUnreachable(CtxProxyError):
    status = 502
    type = "upstream_error"
    code = "upstream_unreachable"


class UpstreamTimeout(CtxProxyError):
    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


class StorageUnavailable(CtxProxyError):
    """The database holding the sessions' state did not answer: nothing was sent upstream (a retry is
    safe). SDKs retry a 503 on their own."""

    status = 503
    type = "server_error"
    code = "archive_unavailable"
