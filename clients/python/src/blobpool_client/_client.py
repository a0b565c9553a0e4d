"""The client: one ``httpx.Client`` (keep-alive, HTTP/1.1) per ``Client``."""

from __future__ import annotations

import os
import tempfile
import time
from contextlib import contextmanager
from typing import (
    IO,
    BinaryIO,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    TypeVar,
    Union,
)
from urllib.parse import quote

import httpx
from blake3 import blake3

from ._errors import (
    BlobpoolError,
    Conflict,
    NotFound,
    TransportError,
    UploadOffsetMismatch,
    VerificationError,
    from_response,
)
from ._types import CachePut, PutResult, Ref, RefSet, Stat, Upload

#: What a put reads: bytes, a binary file object (read in chunks, never
#: whole) or an iterable of byte chunks.
Source = Union[bytes, bytearray, memoryview, IO[bytes], Iterable[bytes]]

#: The size of the pieces read from a source and of the chunks a get yields.
READ_CHUNK = 1 << 20
#: The size of one ``PATCH`` of a resumable upload (the CLI's too).
UPLOAD_CHUNK = 8 << 20

T = TypeVar("T")


def blake3_hex(data: bytes) -> str:
    """The BLAKE3-256 digest of ``data`` as the server names it (64 hex)."""
    return blake3(data).hexdigest()


def _seg(s: str) -> str:
    """A path segment, percent-encoded ('/' kept for names and keys)."""
    return quote(s, safe="/-._~")


class Client:
    """A Blobpool server at ``base_url``, with API ``key`` (sent as
    ``Authorization: Bearer``) or anonymous.

    ``timeout`` is httpx's: per connect, read and write, not a deadline for
    a whole transfer. Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        key: Optional[str] = None,
        timeout: float = 60.0,
        verify_tls: Union[bool, str] = True,
    ) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=timeout,
            verify=verify_tls,
            follow_redirects=False,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ---------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        *,
        ok: Sequence[int] = (200,),
        **kw: object,
    ) -> httpx.Response:
        """One request whose answer is read whole; an error answer raises
        its typed error, a broken connection :class:`TransportError`."""
        try:
            resp = self._http.request(method, path, **kw)  # type: ignore[arg-type]
        except httpx.HTTPError as e:
            raise TransportError(f"{method} {path}: {e}") from e
        if resp.status_code not in ok:
            err = from_response(resp, resp.content)
            if kw.get("content") is not None:
                _discard_connection(resp)
            raise err
        return resp

    @contextmanager
    def _stream(
        self, method: str, path: str, ok: Sequence[int], **kw: object
    ) -> Iterator[httpx.Response]:
        try:
            with self._http.stream(method, path, **kw) as resp:  # type: ignore[arg-type]
                if resp.status_code not in ok:
                    raise from_response(resp, resp.read())
                yield resp
        except httpx.HTTPError as e:
            raise TransportError(f"{method} {path}: {e}") from e

    # -- blobs -------------------------------------------------------------

    def put(
        self,
        namespace: str,
        source: Source,
        *,
        expect_digest: Optional[str] = None,
        ref: Optional[str] = None,
        release: bool = False,
    ) -> PutResult:
        """``PUT /v1/blobs/{ns}``: streams ``source`` (never read whole),
        hashing it as it goes; the server's digest must be the same
        (:class:`VerificationError` otherwise). ``expect_digest`` makes the
        server refuse other content (``422``).

        The answer's pin token protects the entry until released: with
        ``ref=NAME`` it is handed to that reference (``PUT /v1/refs`` with
        the token: the server releases it once the reference is committed);
        with ``release=True`` it is released at once; otherwise it is the
        caller's to hand over or :meth:`release`.
        """
        hasher = blake3()
        headers: Dict[str, str] = {"Content-Type": "application/octet-stream"}
        length = _length_of(source)
        if length is not None:
            headers["Content-Length"] = str(length)
        if expect_digest:
            headers["x-blobpool-expect-digest"] = expect_digest
        resp = self._send(
            "PUT",
            f"/v1/blobs/{_seg(namespace)}",
            ok=(200, 201),
            content=_hashing(_chunks(source), hasher),
            headers=headers,
        )
        body = resp.json()
        digest = body["digest"]
        if digest != hasher.hexdigest():
            raise VerificationError(
                f"the server stored {digest}, but the bytes sent hash to {hasher.hexdigest()}"
            )
        result = PutResult(namespace, digest, body.get("token"), resp.status_code == 201)
        return self._settle_token(result, ref, release)

    def _settle_token(self, result: PutResult, ref: Optional[str], release: bool) -> PutResult:
        """Hands ``result``'s token to ``ref`` or releases it, as asked."""
        if ref is not None:
            self.set_ref(result.namespace, ref, result.digest, token=result.token)
            return PutResult(result.namespace, result.digest, None, result.created, ref)
        if release and result.token is not None:
            self.release(result.token)
            return PutResult(result.namespace, result.digest, None, result.created)
        return result

    def release(self, token: str) -> None:
        """``DELETE /v1/tokens/{token}``: drops the pin (``NotFound`` when
        unknown, released or expired)."""
        self._send("DELETE", f"/v1/tokens/{_seg(token)}", ok=(204,))

    def have(self, namespace: str, digests: Sequence[str]) -> List[bool]:
        """``POST /v1/have``: which of ``digests`` (at most 10,000) are stored."""
        body = {"namespace": namespace, "digests": list(digests)}
        return list(self._send("POST", "/v1/have", json=body).json()["present"])

    def renew(self, namespace: str, digest: str, token: str) -> bool:
        """The renewal probe: True while ``token`` still pins ``digest``."""
        body = {"namespace": namespace, "digests": [digest], "token": token}
        return bool(self._send("POST", "/v1/have", json=body).json()["present"][0])

    def stat(self, namespace: str, digest: str) -> Optional[Stat]:
        """``HEAD /v1/blobs/{ns}/{digest}``; None when absent."""
        return self._head(f"/v1/blobs/{_seg(namespace)}/{_seg(digest)}")

    def delete(self, namespace: str, digest: str) -> None:
        """``DELETE /v1/blobs/{ns}/{digest}`` (``Conflict`` with ``reason``
        while protected)."""
        self._send("DELETE", f"/v1/blobs/{_seg(namespace)}/{_seg(digest)}", ok=(204,))

    def get(
        self,
        namespace: str,
        digest: str,
        *,
        start: Optional[int] = None,
        end: Optional[int] = None,
    ) -> Iterator[bytes]:
        """``GET /v1/blobs/{ns}/{digest}``, as chunks (ADR-068).

        Whole entries are hashed as they stream: the last chunk is held back
        until the BLAKE3 digest of everything received equals ``digest``, so
        an iteration that ends without an exception delivered exactly the
        entry, and a mismatch raises :class:`VerificationError` without
        yielding the tail. A range (``start``, ``end`` inclusive or None for
        the end) is checked by the server against the entry's outboard
        before it is sent (ADR-032); here its ``Content-Range`` and length
        must be the ones asked for, and its last chunk too is held back
        until they are. A stream the server cuts (how it reports corrupt
        content once the head is out) raises :class:`TransportError`.
        Iterate to the end, or ``close()`` the iterator to free the
        connection. For bytes that are never seen unverified use
        :meth:`get_bytes` or :meth:`download`.
        """
        path = f"/v1/blobs/{_seg(namespace)}/{_seg(digest)}"
        return self._verified(path, digest, start, end)

    def get_bytes(
        self,
        namespace: str,
        digest: str,
        *,
        start: Optional[int] = None,
        end: Optional[int] = None,
    ) -> bytes:
        """:meth:`get` into memory: returned only once verified."""
        return b"".join(self.get(namespace, digest, start=start, end=end))

    def download(self, namespace: str, digest: str, path: Union[str, "os.PathLike[str]"]) -> int:
        """:meth:`get` into a temporary file beside ``path``, renamed to
        ``path`` only once verified (removed otherwise); its size."""
        return _write_verified(path, self.get(namespace, digest))

    def _verified(
        self, path: str, digest: Optional[str], start: Optional[int], end: Optional[int]
    ) -> Iterator[bytes]:
        headers = {}
        ranged = start is not None or end is not None
        if ranged:
            headers["Range"] = f"bytes={start or 0}-{'' if end is None else end}"
        with self._stream("GET", path, ok=(206,) if ranged else (200,), headers=headers) as resp:
            if not ranged:
                digest = digest or resp.headers.get("x-blobpool-digest")
                if not digest:
                    raise VerificationError(f"GET {path}: the answer names no digest")
            expected = _expected_length(resp, start, end)
            hasher = blake3() if not ranged else None
            held, got = b"", 0
            for chunk in resp.iter_bytes(READ_CHUNK):
                got += len(chunk)
                if hasher is not None:
                    hasher.update(chunk)
                if held:
                    yield held
                held = chunk
            if got != expected:
                raise TransportError(f"GET {path}: {got} bytes of {expected}: the stream was cut")
            if hasher is not None and hasher.hexdigest() != digest:
                raise VerificationError(
                    f"GET {path}: the content hashes to {hasher.hexdigest()}, not {digest}"
                )
            if held:
                yield held

    def _head(self, path: str) -> Optional[Stat]:
        try:
            resp = self._send("HEAD", path)
        except NotFound:
            return None
        h = resp.headers
        created = h.get("x-blobpool-created-at")
        return Stat(
            digest=h.get("x-blobpool-digest") or h.get("etag", "").strip('"'),
            size=int(h["content-length"]),
            tier=h.get("x-blobpool-tier"),
            created_at=int(created) if created else None,
        )

    # -- references --------------------------------------------------------

    def set_ref(
        self,
        namespace: str,
        name: str,
        digest: str,
        *,
        token: Optional[str] = None,
        if_match: Optional[str] = None,
        if_absent: bool = False,
    ) -> RefSet:
        """``PUT /v1/refs/{ns}/{name}``. ``token`` (a put's) is released
        once the reference is committed; ``if_match`` (the digest it must
        name now) and ``if_absent`` make it a compare-and-swap
        (``PreconditionFailed`` when it fails)."""
        body: Dict[str, str] = {"digest": digest}
        if token is not None:
            body["token"] = token
        resp = self._send(
            "PUT",
            f"/v1/refs/{_seg(namespace)}/{_seg(name)}",
            ok=(200, 201),
            json=body,
            headers=_preconditions(if_match, if_absent),
        )
        v = resp.json()
        return RefSet(
            ref=Ref(v["namespace"], v["name"], v["digest"]),
            previous=v.get("previous"),
            token_released=bool(v.get("token_released")),
            policy_adopted=bool(v.get("policy_adopted")),
        )

    def get_ref(self, namespace: str, name: str) -> Ref:
        """``GET /v1/refs/{ns}/{name}`` (``NotFound`` when absent)."""
        v = self._send("GET", f"/v1/refs/{_seg(namespace)}/{_seg(name)}").json()
        return Ref(v["namespace"], v["name"], v["digest"])

    def delete_ref(self, namespace: str, name: str, *, if_match: Optional[str] = None) -> None:
        """``DELETE /v1/refs/{ns}/{name}``."""
        self._send(
            "DELETE",
            f"/v1/refs/{_seg(namespace)}/{_seg(name)}",
            ok=(204,),
            headers=_preconditions(if_match, False),
        )

    def list_refs(self, namespace: str, *, prefix: str = "") -> Iterator[Ref]:
        """``GET /v1/refs/{ns}``, every page, in name order."""
        after: Optional[str] = None
        while True:
            params = {"prefix": prefix}
            if after is not None:
                params["after"] = after
            v = self._send("GET", f"/v1/refs/{_seg(namespace)}", params=params).json()
            for r in v["refs"]:
                yield Ref(namespace, r["name"], r["digest"])
            after = v.get("next")
            if after is None:
                return

    # -- resumable uploads -------------------------------------------------

    def open_upload(self, namespace: str) -> Upload:
        """``POST /v1/uploads/{ns}``: a new session at offset 0."""
        v = self._send(
            "POST",
            f"/v1/uploads/{_seg(namespace)}",
            ok=(201,),
            headers={"Content-Type": "application/json"},
        ).json()
        return Upload(v["namespace"], v["id"], v["location"])

    def upload_offset(self, upload: Upload) -> int:
        """``HEAD {location}``: the committed offset (asked again while the
        server is still busy with a broken-off request)."""
        resp = _retry_busy(lambda: self._send("HEAD", upload.location, ok=(204,)))
        return int(resp.headers["upload-offset"])

    def upload_append(self, upload: Upload, offset: int, data: bytes) -> int:
        """``PATCH {location}``: ``data`` at ``offset``; the new offset
        (``UploadOffsetMismatch`` names the committed one)."""
        if not data:
            return offset
        headers = {"Content-Range": f"bytes {offset}-{offset + len(data) - 1}/*"}
        resp = self._send("PATCH", upload.location, ok=(204,), content=data, headers=headers)
        return int(resp.headers["upload-offset"])

    def upload_finish(self, upload: Upload, digest: str) -> PutResult:
        """``PUT {location}?digest=``: stores the session's bytes, which
        must hash to ``digest`` (``ServerVerificationError`` otherwise;
        the session stays)."""
        resp = self._send("PUT", upload.location, ok=(200, 201), params={"digest": digest})
        v = resp.json()
        return PutResult(upload.namespace, v["digest"], v.get("token"), resp.status_code == 201)

    def upload_abort(self, upload: Upload) -> None:
        """``DELETE {location}``: the session and its bytes are gone."""
        self._send("DELETE", upload.location, ok=(204,))

    def upload(
        self,
        namespace: str,
        file: BinaryIO,
        *,
        chunk_size: int = UPLOAD_CHUNK,
        attempts: int = 5,
        ref: Optional[str] = None,
        release: bool = False,
    ) -> PutResult:
        """A put through a resumable session: ``file`` (seekable, binary,
        read from its current position) goes in ``chunk_size`` chunks; when
        a chunk's connection breaks, the committed offset is asked for and
        the upload goes on from there (up to ``attempts`` breaks in a row).
        The digest is computed here as the bytes are read, so a finish that
        the server refuses (``422``) means the bytes were changed on the
        way. ``ref`` and ``release`` as for :meth:`put`."""
        base = file.tell()
        session = self.open_upload(namespace)
        hasher, hashed, offset, failures = blake3(), 0, 0, 0
        while True:
            # Bytes the server committed beyond what was hashed (a broken-off
            # chunk commits what arrived) are hashed from the file first.
            hashed = _hash_span(file, base, hashed, offset, hasher)
            file.seek(base + offset)
            data = file.read(chunk_size)
            if not data:
                break
            try:
                new = self.upload_append(session, offset, data)
                if hashed == offset and new == offset + len(data):
                    hasher.update(data)
                    hashed = new
                offset, failures = new, 0
            except (TransportError, Conflict, UploadOffsetMismatch) as e:
                if isinstance(e, Conflict) and e.code != "upload_busy":
                    raise
                failures += 1
                if failures >= attempts:
                    raise
                time.sleep(0.2 * failures)
                offset = self.upload_offset(session)
        result = self.upload_finish(session, hasher.hexdigest())
        return self._settle_token(result, ref, release)

    # -- build cache -------------------------------------------------------

    def cache_put(
        self,
        namespace: str,
        key: str,
        source: Source,
        *,
        if_match: Optional[str] = None,
        if_absent: bool = False,
    ) -> CachePut:
        """``PUT /cache/{ns}/{key}`` (the namespace's policy is ``cache``):
        streams ``source``; the digest the key now names must be the
        bytes' (:class:`VerificationError` otherwise)."""
        hasher = blake3()
        headers = _preconditions(if_match, if_absent)
        length = _length_of(source)
        if length is not None:
            headers["Content-Length"] = str(length)
        resp = self._send(
            "PUT",
            f"/cache/{_seg(namespace)}/{_seg(key)}",
            ok=(200, 201),
            content=_hashing(_chunks(source), hasher),
            headers=headers,
        )
        digest = resp.headers.get("x-blobpool-digest", "")
        if digest != hasher.hexdigest():
            raise VerificationError(
                f"the key names {digest or 'nothing'}, but the bytes sent hash to {hasher.hexdigest()}"
            )
        return CachePut(namespace, key, digest, resp.status_code == 201)

    def cache_get(self, namespace: str, key: str) -> Iterator[bytes]:
        """``GET /cache/{ns}/{key}``, verified as :meth:`get` verifies a
        whole entry, against the digest the answer names (for a
        ``cas/<hex>`` key, against the key's own)."""
        expected = key[4:] if key.startswith("cas/") and len(key) == 68 else None
        return self._verified(f"/cache/{_seg(namespace)}/{_seg(key)}", expected, None, None)

    def cache_stat(self, namespace: str, key: str) -> Optional[Stat]:
        """``HEAD /cache/{ns}/{key}``; None when absent."""
        return self._head(f"/cache/{_seg(namespace)}/{_seg(key)}")

    def cache_delete(self, namespace: str, key: str) -> None:
        """``DELETE /cache/{ns}/{key}`` (needs ``delete``)."""
        self._send("DELETE", f"/cache/{_seg(namespace)}/{_seg(key)}", ok=(204,))


# -- helpers -----------------------------------------------------------------


def _length_of(source: Source) -> Optional[int]:
    """The length of bytes, or of a regular file from its position."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return len(source)
    fileno = getattr(source, "fileno", None)
    tell = getattr(source, "tell", None)
    if fileno is not None and tell is not None:
        try:
            st = os.fstat(fileno())
        except (OSError, ValueError):
            return None
        if os.path.stat.S_ISREG(st.st_mode):  # type: ignore[attr-defined]
            return st.st_size - tell()
    return None


def _chunks(source: Source) -> Iterator[bytes]:
    """``source`` as chunks of at most :data:`READ_CHUNK` (a file is read
    piece by piece)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        view = memoryview(source)
        for i in range(0, len(view), READ_CHUNK):
            yield bytes(view[i : i + READ_CHUNK])
        return
    read = getattr(source, "read", None)
    if read is not None:
        while True:
            chunk = read(READ_CHUNK)
            if not chunk:
                return
            yield chunk
    else:
        for chunk in source:  # type: ignore[union-attr]
            yield bytes(chunk)


def _hashing(chunks: Iterator[bytes], hasher: "blake3") -> Iterator[bytes]:
    for chunk in chunks:
        hasher.update(chunk)
        yield chunk


def _hash_span(file: BinaryIO, base: int, hashed: int, upto: int, hasher: "blake3") -> int:
    """Hashes ``file``'s bytes ``hashed..upto`` (relative to ``base``)."""
    if hashed < upto:
        file.seek(base + hashed)
        while hashed < upto:
            piece = file.read(min(READ_CHUNK, upto - hashed))
            if not piece:
                raise BlobpoolError("the file is shorter than what the server committed")
            hasher.update(piece)
            hashed += len(piece)
    return hashed


def _expected_length(resp: httpx.Response, start: Optional[int], end: Optional[int]) -> int:
    """The body length the answer promises; for a range, checks that its
    ``Content-Range`` is the range asked for."""
    if resp.status_code != 206:
        return int(resp.headers["content-length"])
    unit, _, spec = resp.headers.get("content-range", "").partition(" ")
    span, _, size = spec.partition("/")
    a, _, b = span.partition("-")
    try:
        first, last, total = int(a), int(b), int(size)
    except ValueError:
        raise BlobpoolError(f"bad Content-Range {resp.headers.get('content-range')!r}") from None
    want_last = total - 1 if end is None else min(end, total - 1)
    if unit != "bytes" or first != (start or 0) or last != want_last:
        raise BlobpoolError(f"asked for bytes {start}-{end}, got {spec}")
    return last - first + 1


def _discard_connection(resp: httpx.Response) -> None:
    """Closes the connection of an error answer to a request with a body:
    the server may answer before reading the body and then close the
    connection, and a pooled connection closed that way would fail the next
    request sent on it (\"Server disconnected without sending a response\")."""
    stream = resp.extensions.get("network_stream")
    if stream is not None:
        stream.close()


def _preconditions(if_match: Optional[str], if_absent: bool) -> Dict[str, str]:
    h: Dict[str, str] = {}
    if if_match is not None:
        h["If-Match"] = f'"{if_match}"'
    if if_absent:
        h["If-None-Match"] = "*"
    return h


def _retry_busy(call: Callable[[], T], tries: int = 50) -> T:
    """``call``, again while it answers ``upload_busy`` (a broken-off
    request the server is still finishing), 0.1 s apart."""
    for _ in range(tries - 1):
        try:
            return call()
        except Conflict as e:
            if e.code != "upload_busy":
                raise
            time.sleep(0.1)
    return call()


def _write_verified(path: Union[str, "os.PathLike[str]"], chunks: Iterator[bytes]) -> int:
    target = os.fspath(path)
    fd, tmp = tempfile.mkstemp(prefix=".blobpool-", dir=os.path.dirname(target) or ".")
    try:
        size = 0
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                size += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        return size
    except BaseException:
        os.unlink(tmp)
        raise

