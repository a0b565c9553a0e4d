"""The client against the real server (see conftest.py)."""

from __future__ import annotations

import io
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from blobpool_client import (
    Client,
    Conflict,
    Forbidden,
    NotFound,
    PreconditionFailed,
    RangeNotSatisfiable,
    ServerError,
    ServerVerificationError,
    TransportError,
    Unauthorized,
    UploadOffsetMismatch,
    VerificationError,
    blake3_hex,
)

from conftest import CACHE_NS, Server
from proxy import Proxy

MiB = 1 << 20


def ns() -> str:
    """A fresh namespace per test."""
    return "py-" + uuid.uuid4().hex[:12]


def content(n: int) -> bytes:
    return os.urandom(n)


def test_put_streams_a_file_and_get_verifies_it(bp: Client) -> None:
    n, data = ns(), content(3 * MiB + 17)
    first = bp.put(n, io.BytesIO(data))
    assert first.digest == blake3_hex(data) and first.created and first.token
    again = bp.put(n, iter([data[:1000], data[1000:]]))  # chunked, no length
    assert again.digest == first.digest and not again.created
    assert bp.get_bytes(n, first.digest) == data
    assert bp.have(n, [first.digest, blake3_hex(b"absent")]) == [True, False]
    stat = bp.stat(n, first.digest)
    assert stat is not None and stat.size == len(data) and stat.tier == "large"
    assert stat.created_at and stat.digest == first.digest
    assert bp.stat(n, blake3_hex(b"absent")) is None
    # The pin tokens protect the entry until released.
    with pytest.raises(Conflict) as e:
        bp.delete(n, first.digest)
    assert (e.value.code, e.value.reason, e.value.status) == ("gc_refuse", "pinned", 409)
    assert bp.renew(n, first.digest, first.token)
    for token in (first.token, again.token):
        assert token is not None
        bp.release(token)
    assert not bp.renew(n, first.digest, first.token)
    with pytest.raises(NotFound):
        bp.release(first.token)
    bp.delete(n, first.digest)
    assert bp.have(n, [first.digest]) == [False]


def test_put_of_a_real_file_sends_its_length(bp: Client, tmp_path: Path) -> None:
    n, data = ns(), content(200_000)
    f = tmp_path / "f.bin"
    f.write_bytes(data)
    with f.open("rb") as src:
        r = bp.put(n, src, release=True)
    assert r.digest == blake3_hex(data) and r.token is None
    assert bp.download(n, r.digest, tmp_path / "out.bin") == len(data)
    assert (tmp_path / "out.bin").read_bytes() == data


def test_put_hands_its_token_to_a_reference(bp: Client) -> None:
    n, data = ns(), content(100_000)
    r = bp.put(n, data, ref="releases/v1/app.tar")
    assert r.token is None and r.ref == "releases/v1/app.tar"
    assert bp.get_ref(n, "releases/v1/app.tar").digest == r.digest
    # The token was released: only the reference protects the entry.
    with pytest.raises(Conflict) as e:
        bp.delete(n, r.digest)
    assert e.value.reason == "live"


def test_references_compare_and_swap_and_list(bp: Client) -> None:
    n = ns()
    a = bp.put(n, b"a" * 10)
    b = bp.put(n, b"b" * 10)
    assert a.token and b.token
    created = bp.set_ref(n, "x/one", a.digest, token=a.token, if_absent=True)
    assert created.previous is None and created.token_released
    assert not bp.renew(n, a.digest, a.token)
    with pytest.raises(PreconditionFailed) as e:
        bp.set_ref(n, "x/one", b.digest, if_absent=True)
    assert (e.value.code, e.value.status) == ("ref_conflict", 412)
    moved = bp.set_ref(n, "x/one", b.digest, if_match=a.digest)
    assert moved.previous == a.digest and not moved.token_released
    bp.set_ref(n, "x/two", a.digest)
    bp.set_ref(n, "y", a.digest)
    assert [(r.name, r.digest) for r in bp.list_refs(n, prefix="x/")] == [
        ("x/one", b.digest),
        ("x/two", a.digest),
    ]
    with pytest.raises(PreconditionFailed):
        bp.delete_ref(n, "y", if_match=b.digest)
    bp.delete_ref(n, "y")
    with pytest.raises(NotFound) as nf:
        bp.get_ref(n, "y")
    assert nf.value.code == "missing" and nf.value.request_id


def test_ranges(bp: Client) -> None:
    n, data = ns(), content(2 * MiB + 5)
    d = bp.put(n, data, release=True).digest
    assert bp.get_bytes(n, d, start=0, end=0) == data[:1]
    assert bp.get_bytes(n, d, start=100_000, end=1_500_000) == data[100_000:1_500_001]
    assert bp.get_bytes(n, d, start=len(data) - 10) == data[-10:]
    assert bp.get_bytes(n, d, start=5, end=10 * MiB) == data[5:]
    with pytest.raises(RangeNotSatisfiable) as e:
        bp.get_bytes(n, d, start=len(data))
    assert (e.value.code, e.value.status) == ("invalid_range", 416)


def test_expected_digest_refused_by_the_server(bp: Client) -> None:
    n, data = ns(), content(70_000)
    with pytest.raises(ServerVerificationError) as e:
        bp.put(n, data, expect_digest=blake3_hex(b"other"))
    assert (e.value.code, e.value.status) == ("verification", 422)
    assert isinstance(e.value, VerificationError)
    assert bp.have(n, [blake3_hex(data)]) == [False]


def test_errors_carry_the_servers_code(server: Server, bp: Client) -> None:
    n = ns()
    with server.client("reader") as reader, pytest.raises(Forbidden) as e:
        reader.put(n, b"x")
    assert (e.value.code, e.value.status) == ("forbidden", 403)
    with server.client("") as anonymous, pytest.raises(Unauthorized) as u:
        anonymous.have(n, [blake3_hex(b"x")])
    assert u.value.code == "unauthorized"
    with pytest.raises(NotFound) as m:
        bp.get_bytes(n, blake3_hex(b"absent"))
    assert (m.value.code, m.value.status) == ("missing", 404)
    with pytest.raises(ServerError) as k:
        bp.have(n, ["not-a-digest"])
    assert (k.value.code, k.value.status) == ("key_invalid", 400)


def test_a_corrupted_response_is_refused_without_its_tail(server: Server, tmp_path: Path) -> None:
    n, data = ns(), content(3 * MiB)
    with server.client() as bp:
        d = bp.put(n, data, release=True).digest
    proxy = Proxy(server.url.removeprefix("http://"), flip_at=len(data) - 1000)
    try:
        with server.client(url=proxy.url) as via:
            got = []
            with pytest.raises(VerificationError):
                for chunk in via.get(n, d):
                    got.append(chunk)
            assert proxy.flips == 1
            # Everything yielded is a prefix of the entry, and the chunk
            # that carried the flipped byte was never yielded.
            seen = b"".join(got)
            assert len(seen) <= len(data) - 1000 and data.startswith(seen)
        target = tmp_path / "out.bin"
        proxy.flips = 0
        with server.client(url=proxy.url) as via, pytest.raises(VerificationError):
            via.download(n, d, target)  # a new connection, flipped again
        assert proxy.flips == 1
        assert not target.exists() and list(tmp_path.iterdir()) == []
    finally:
        proxy.close()


def test_a_blob_corrupted_on_disk_is_never_delivered(server: Server, tmp_path: Path) -> None:
    n, data = ns(), content(2 * MiB)
    with server.client() as bp:
        d = bp.put(n, data, release=True).digest
        stored = [p for p in (server.data_dir / "large").rglob("*") if _holds(p, data)]
        assert len(stored) == 1, stored
        raw = bytearray(stored[0].read_bytes())
        raw[len(raw) - 100] ^= 0x01
        stored[0].write_bytes(bytes(raw))
        target = tmp_path / "out.bin"
        with pytest.raises((TransportError, VerificationError)):
            bp.download(n, d, target)
        assert not target.exists()


def _holds(p: Path, data: bytes) -> bool:
    return p.is_file() and p.stat().st_size == len(data) and p.read_bytes() == data


def _patch_and_drop(server: Server, location: str, key: str, total: int, part: bytes) -> None:
    """A PATCH announcing ``total`` bytes that sends ``part`` and closes."""
    host, _, port = server.url.removeprefix("http://").rpartition(":")
    with socket.create_connection((host, int(port))) as s:
        head = (
            f"PATCH {location} HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Length: {total}\r\n"
            f"Content-Range: bytes 0-{total - 1}/*\r\n\r\n"
        )
        s.sendall(head.encode() + part)


def test_an_upload_resumes_after_a_dropped_connection(server: Server, bp: Client) -> None:
    n, data = ns(), content(5 * MiB + 3)
    session = bp.open_upload(n)
    sent = 3 * MiB
    _patch_and_drop(server, session.location, server.keys["writer"], len(data), data[:sent])
    # The server commits what arrived once it has read the broken body
    # (a HEAD meanwhile answers upload_busy, which upload_offset waits out,
    # or, before the PATCH is even parsed, 0).
    deadline = time.monotonic() + 20
    while (offset := bp.upload_offset(session)) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 0 < offset <= sent
    with pytest.raises(UploadOffsetMismatch) as e:
        bp.upload_append(session, offset + 1, data[offset + 1 :])
    assert e.value.upload_offset == offset
    assert bp.upload_append(session, offset, data[offset:]) == len(data)
    with pytest.raises(ServerVerificationError):
        bp.upload_finish(session, blake3_hex(b"wrong"))
    r = bp.upload_finish(session, blake3_hex(data))  # the session stayed
    assert r.digest == blake3_hex(data) and r.created and r.token
    bp.release(r.token)
    assert bp.get_bytes(n, r.digest) == data
    with pytest.raises(NotFound):
        bp.upload_offset(session)


def test_upload_resumes_by_itself_through_a_cut_connection(server: Server) -> None:
    n, data = ns(), content(6 * MiB + 1)
    proxy = Proxy(server.url.removeprefix("http://"), cut_after=3 * MiB + 12345)
    try:
        with server.client(url=proxy.url) as via:
            r = via.upload(n, io.BytesIO(data), chunk_size=2 * MiB, ref="big.bin")
        assert proxy.cuts == 1
        assert r.digest == blake3_hex(data) and r.token is None and r.ref == "big.bin"
        with server.client() as bp:
            assert bp.get_bytes(n, r.digest) == data
            bp.delete_ref(n, "big.bin")
    finally:
        proxy.close()


def test_upload_abort(bp: Client) -> None:
    session = bp.open_upload(ns())
    bp.upload_append(session, 0, b"abc")
    bp.upload_abort(session)
    with pytest.raises(NotFound):
        bp.upload_offset(session)


def test_cache_keys(server: Server, bp: Client) -> None:
    key, data = f"objects/{uuid.uuid4().hex}", content(300_000)
    assert bp.cache_stat(CACHE_NS, key) is None
    put = bp.cache_put(CACHE_NS, key, io.BytesIO(data), if_absent=True)
    assert put.digest == blake3_hex(data) and put.created
    with pytest.raises(PreconditionFailed) as e:
        bp.cache_put(CACHE_NS, key, b"other", if_absent=True)
    assert e.value.status == 412
    assert b"".join(bp.cache_get(CACHE_NS, key)) == data
    stat = bp.cache_stat(CACHE_NS, key)
    assert stat is not None and stat.size == len(data)
    # Content-addressed keys, and plain puts into a cache namespace (no token).
    cas = bp.put(CACHE_NS, b"cas bytes")
    assert cas.token is None
    assert b"".join(bp.cache_get(CACHE_NS, "cas/" + cas.digest)) == b"cas bytes"
    with server.client("reader") as reader, pytest.raises(Forbidden):
        reader.cache_delete(CACHE_NS, key)
    bp.cache_delete(CACHE_NS, key)
    assert bp.cache_stat(CACHE_NS, key) is None
    with pytest.raises(NotFound):
        list(bp.cache_get(CACHE_NS, key))


def test_get_iterator_closes_early(bp: Client) -> None:
    n, data = ns(), content(4 * MiB)
    d = bp.put(n, data, release=True).digest
    it: Iterator[bytes] = bp.get(n, d)
    assert data.startswith(next(it))
    it.close()  # type: ignore[attr-defined]
    assert bp.get_bytes(n, d) == data  # the client still works
