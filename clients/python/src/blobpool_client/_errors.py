"""Typed errors: every error answer of the server carries a stable `code`
(docs/SERVER.md, Conventions); each code has a class here, and an unknown
code is a plain :class:`ServerError` (to be treated like ``internal``)."""

from __future__ import annotations

import json
from typing import Dict, Optional, Type

import httpx


class BlobpoolError(Exception):
    """Base class of every error this client raises."""


class TransportError(BlobpoolError):
    """The connection failed or broke off (no complete answer)."""


class VerificationError(BlobpoolError):
    """Bytes did not hash to the digest that names them: found by this
    client while streaming, or answered by the server (``verification``)."""

    code = "verification"


class ServerError(BlobpoolError):
    """An error answer of the server: ``status``, ``code``, ``message``,
    ``reason`` (``gc_refuse`` only) and the request id to find it in the
    server's log."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        reason: Optional[str] = None,
        request_id: Optional[str] = None,
        upload_offset: Optional[int] = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.reason = reason
        self.request_id = request_id
        #: ``Upload-Offset`` of the answer (``upload_offset`` errors name the
        #: committed offset there).
        self.upload_offset = upload_offset


class BadRequest(ServerError):
    """``bad_request``, ``key_invalid``, ``length_mismatch``,
    ``incomplete_body``, ``unsupported_media_type``."""


class Unauthorized(ServerError):
    """``unauthorized``: no or a wrong key."""


class Forbidden(ServerError):
    """``forbidden``: the key lacks the scope, or the token is another's."""


class HostNotAllowed(ServerError):
    """``host_not_allowed``: the URL's host is not in ``http.allowed_hosts``."""


class NotFound(ServerError):
    """``missing`` (no such entry, token, reference, session) or
    ``not_found`` (no such route)."""


class Conflict(ServerError):
    """``gc_refuse`` (with ``reason``), ``upload_elsewhere``, ``upload_busy``."""


class PreconditionFailed(ServerError):
    """``ref_conflict``: an ``If-Match`` / ``If-None-Match`` failed."""


class TooLarge(ServerError):
    """``too_large``, ``too_many``."""


class RangeNotSatisfiable(ServerError):
    """``invalid_range``."""


class UploadOffsetMismatch(ServerError):
    """``upload_offset``: the chunk did not start at the committed offset
    (``upload_offset`` says where it is)."""


class Unavailable(ServerError):
    """Retry later: ``too_many_tokens``, ``too_many_uploads``,
    ``overloaded``, ``unavailable``."""


class InsufficientStorage(ServerError):
    """``insufficient_storage``, ``upload_quota``."""


class ServerVerificationError(ServerError, VerificationError):
    """``verification``: the server found the content does not hash to
    the expected digest."""


_BY_CODE: Dict[str, Type[ServerError]] = {
    "bad_request": BadRequest,
    "key_invalid": BadRequest,
    "length_mismatch": BadRequest,
    "incomplete_body": BadRequest,
    "unsupported_media_type": BadRequest,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "host_not_allowed": HostNotAllowed,
    "missing": NotFound,
    "not_found": NotFound,
    "gc_refuse": Conflict,
    "upload_elsewhere": Conflict,
    "upload_busy": Conflict,
    "ref_conflict": PreconditionFailed,
    "too_large": TooLarge,
    "too_many": TooLarge,
    "invalid_range": RangeNotSatisfiable,
    "upload_offset": UploadOffsetMismatch,
    "too_many_tokens": Unavailable,
    "too_many_uploads": Unavailable,
    "overloaded": Unavailable,
    "unavailable": Unavailable,
    "insufficient_storage": InsufficientStorage,
    "upload_quota": InsufficientStorage,
    "verification": ServerVerificationError,
}


def from_response(resp: httpx.Response, body: bytes) -> ServerError:
    """The typed error of an error answer whose body has been read."""
    code, message, reason = "internal", "", None
    try:
        err = json.loads(body)["error"]
        code, message = str(err["code"]), str(err["message"])
        reason = err.get("reason")
    except (ValueError, KeyError, TypeError):
        # No JSON body (a HEAD, a proxy's page): the status says enough.
        code = {404: "missing", 401: "unauthorized", 403: "forbidden"}.get(
            resp.status_code, "internal"
        )
        message = body[:200].decode("utf-8", "replace") or resp.reason_phrase
    offset = resp.headers.get("upload-offset")
    return _BY_CODE.get(code, ServerError)(
        resp.status_code,
        code,
        message,
        reason=reason,
        request_id=resp.headers.get("x-request-id"),
        upload_offset=int(offset) if offset is not None else None,
    )
