"""Runs the real ``blobpool serve`` (``BLOBPOOL_BIN``, default the
workspace's ``target/debug/blobpool``) once per test session: a temporary
data directory, two API keys made by ``blobpool key new``, explicit allowed
hosts, a cache namespace, scheduled sweeps off. A missing binary fails the
tests; nothing is skipped."""

from __future__ import annotations

import os
import subprocess
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Deque, Dict, Iterator, List

import pytest

from blobpool_client import Client

ROOT = Path(__file__).resolve().parents[3]
CACHE_NS = "pycache"


@dataclass
class Server:
    url: str
    data_dir: Path
    keys: Dict[str, str]  # name -> secret
    log: Deque[str]

    def client(self, key: str = "writer", url: str = "") -> Client:
        return Client(url or self.url, key=self.keys[key] if key else None)


def _binary() -> str:
    path = os.environ.get("BLOBPOOL_BIN") or str(ROOT / "target" / "debug" / "blobpool")
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"no blobpool binary at {path}: build it (cargo build -p blobpool) "
            "or set BLOBPOOL_BIN",
            pytrace=False,
        )
    return path


def _env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOBPOOL_")}
    env["RUST_LOG"] = "warn"
    return env


def _new_key(binary: str, cwd: Path, name: str, scopes: List[str]) -> "tuple[str, str]":
    args = [binary, "key", "new", "--name", name]
    for s in scopes:
        args += ["--scope", s]
    out = subprocess.run(
        args, cwd=cwd, env=_env(), check=True, capture_output=True, text=True, timeout=30
    ).stdout
    secret = next(line.split()[1] for line in out.splitlines() if line.startswith("key: "))
    stanza = out[out.index("[[auth.keys]]") :]
    return secret, stanza


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    binary = _binary()
    root = tmp_path_factory.mktemp("blobpool")
    keys, stanzas = {}, []
    for name, scopes in [
        ("writer", ["read", "write", "delete", "admin"]),
        ("reader", ["read"]),
    ]:
        keys[name], stanza = _new_key(binary, root, name, scopes)
        stanzas.append(stanza)
    config = root / "blobpool.toml"
    config.write_text(
        f'data_dir = "{root / "data"}"\n'
        "[http]\n"
        'allowed_hosts = ["127.0.0.1", "localhost"]\n'
        "[gc]\n"
        'interval = "off"\n'
        f"[gc.namespaces.{CACHE_NS}]\n"
        'policy = "cache"\n' + "\n".join(stanzas)
    )
    proc = subprocess.Popen(
        [binary, "serve", "--config", str(config), "--listen", "127.0.0.1:0"],
        cwd=root,
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    log: Deque[str] = deque(maxlen=200)
    url = ""
    assert proc.stderr is not None
    for line in proc.stderr:
        log.append(line)
        if line.startswith("blobpool: listening on "):
            url = line.split()[-1]
            break
    if not url:
        proc.wait(timeout=10)
        pytest.fail("blobpool serve did not start:\n" + "".join(log), pytrace=False)
    stderr = proc.stderr
    threading.Thread(target=lambda: log.extend(stderr), daemon=True).start()
    try:
        yield Server(url, root / "data", keys, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def bp(server: Server) -> Iterator[Client]:
    with server.client() as c:
        yield c
