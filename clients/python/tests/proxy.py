"""A real TCP relay between the client and the server that misbehaves as a
network does: it cuts a connection after some bytes towards the server, or
flips one byte of a response body."""

from __future__ import annotations

import socket
import threading
from typing import List, Optional, Tuple


class Proxy:
    """Relays 127.0.0.1:<port> to ``upstream`` (``host:port``).

    ``cut_after``: the first connection that carries more than this many
    bytes towards the server is closed there (both ways), once.
    ``flip_at``: the byte this many bytes into the first response body
    (after the head's blank line) is inverted, once.
    """

    def __init__(
        self, upstream: str, *, cut_after: Optional[int] = None, flip_at: Optional[int] = None
    ) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream: Tuple[str, int] = (host, int(port))
        self.cut_after = cut_after
        self.flip_at = flip_at
        self.cuts = 0
        self.flips = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._socks: List[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._listener.close()
        for s in self._socks:
            _close(s)

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            up = socket.create_connection(self.upstream)
            self._socks += [down, up]
            threading.Thread(target=self._pump, args=(down, up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upward: bool) -> None:
        sent, body_at = 0, -1
        buf = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if upward and self.cut_after is not None and self.cuts == 0:
                    if sent + len(data) > self.cut_after:
                        dst.sendall(data[: self.cut_after - sent])
                        self.cuts += 1
                        break
                if not upward and self.flip_at is not None and self.flips == 0:
                    if body_at < 0:
                        buf += data
                        end = buf.find(b"\r\n\r\n")
                        if end >= 0:
                            body_at = sent + end + 4
                    at = body_at + self.flip_at if body_at >= 0 else -1
                    if sent <= at < sent + len(data):
                        b = bytearray(data)
                        b[at - sent] ^= 0xFF
                        data = bytes(b)
                        self.flips += 1
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        _close(src)
        _close(dst)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
