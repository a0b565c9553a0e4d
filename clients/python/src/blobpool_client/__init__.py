"""A typed client for the Blobpool HTTP API (docs/SERVER.md).

>>> from blobpool_client import Client
>>> with Client("http://127.0.0.1:7070", key="bpk_…") as bp:
...     stored = bp.put("builds", open("app.tar", "rb"), ref="releases/1.2/app.tar")
...     data = b"".join(bp.get("builds", stored.digest))
"""

from ._client import Client, blake3_hex
from ._errors import (
    BadRequest,
    BlobpoolError,
    Conflict,
    Forbidden,
    HostNotAllowed,
    InsufficientStorage,
    NotFound,
    PreconditionFailed,
    RangeNotSatisfiable,
    ServerError,
    ServerVerificationError,
    TooLarge,
    TransportError,
    Unauthorized,
    Unavailable,
    UploadOffsetMismatch,
    VerificationError,
)
from ._types import CachePut, PutResult, Ref, RefSet, Stat, Upload

__all__ = [
    "BadRequest",
    "BlobpoolError",
    "CachePut",
    "Client",
    "Conflict",
    "Forbidden",
    "HostNotAllowed",
    "InsufficientStorage",
    "NotFound",
    "PreconditionFailed",
    "PutResult",
    "RangeNotSatisfiable",
    "Ref",
    "RefSet",
    "ServerError",
    "ServerVerificationError",
    "Stat",
    "TooLarge",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "Upload",
    "UploadOffsetMismatch",
    "VerificationError",
    "blake3_hex",
]
