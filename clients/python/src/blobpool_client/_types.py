"""The answers of the API, as frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class PutResult:
    """A stored blob. ``token`` is the pin token the server holds for it
    (None once released or handed to a reference, and in cache
    namespaces, which mint none)."""

    namespace: str
    digest: str
    token: Optional[str]
    #: False when the server already had the content (``200``).
    created: bool
    #: The reference the token was handed to (``put(..., ref=NAME)``).
    ref: Optional[str] = None


@dataclass(frozen=True)
class Stat:
    """What ``HEAD`` says of an entry or cache key."""

    digest: str
    size: int
    tier: Optional[str]
    #: Unix milliseconds (blobs only; None for cache keys).
    created_at: Optional[int]


@dataclass(frozen=True)
class Ref:
    """A reference: ``name`` in ``namespace`` names ``digest``."""

    namespace: str
    name: str
    digest: str


@dataclass(frozen=True)
class RefSet:
    """The answer of setting a reference."""

    ref: Ref
    #: The digest it named before (None: it was created).
    previous: Optional[str]
    #: Whether the put's pin token given with it was released.
    token_released: bool
    #: Whether this set switched the namespace to the ``refs`` policy.
    policy_adopted: bool


@dataclass(frozen=True)
class Upload:
    """A resumable upload session (``POST /v1/uploads/{ns}``)."""

    namespace: str
    id: str
    location: str


@dataclass(frozen=True)
class CachePut:
    """A cache key pointed at stored bytes."""

    namespace: str
    key: str
    digest: str
    #: False when the key already named these bytes (``200``).
    created: bool
