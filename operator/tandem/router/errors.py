"""OpenAI-style error bodies, as vLLM writes them (`{"error": {message, type, param, code}}`), and
`ClientGone`, the router's one exception for a client that left."""

from __future__ import annotations

import json
from typing import Final

_TYPES: Final[dict[int, str]] = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    431: "RequestHeaderFieldsTooLargeError",
    499: "ClientClosedRequest",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


def error_type(status: int) -> str:
    return _TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")


def error_body(status: int, message: str, *, param: str | None = None) -> bytes:
    payload = {"error": {"message": message, "type": error_type(status), "param": param, "code": status}}
    return json.dumps(payload).encode()


class ClientGone(Exception):
    """The client closed its connection; whatever serves it is abandoned."""
