"""The download path, for real, against an HTTP server on 127.0.0.1."""

from __future__ import annotations

import functools
import hashlib
import http.server
import re
import shutil
import socket
import threading
from pathlib import Path

import pytest

from amopt.datasets import (
    ChecksumError,
    DownloadError,
    dataset_info,
    fetch_libsvm,
    get_data_home,
    load_libsvm,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
LIBSVM = DATA / "libsvm"
pytestmark = pytest.mark.skipif(
    not (LIBSVM / "a1a").is_file(), reason=f"offline LIBSVM data directory {LIBSVM} is absent"
)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, *args):  # keep the test output clean
        pass

    def do_GET(self):
        type(self).requests.append(self.path)
        super().do_GET()


@pytest.fixture
def mirror(tmp_path):
    """A LIBSVM-layout mirror served on 127.0.0.1; yields (base_url, root, requests)."""
    root = tmp_path / "mirror"
    (root / "binary").mkdir(parents=True)
    handler = type("Handler", (_QuietHandler,), {"requests": []})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", root, handler.requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _no_partial_files(directory: Path) -> bool:
    return not any(p.name.endswith(".part") for p in directory.rglob("*"))


def test_download_verifies_and_caches(mirror, tmp_path):
    base_url, root, requests = mirror
    shutil.copyfile(LIBSVM / "a1a", root / "binary" / "a1a")
    cache = tmp_path / "cache"
    path = fetch_libsvm("a1a", cache_dir=cache, base_url=base_url)
    assert path == cache / "libsvm" / "a1a"
    expected = dataset_info("a1a").sha256
    assert hashlib.sha256(path.read_bytes()).hexdigest() == expected
    assert requests == ["/binary/a1a"]
    # Second call: served from the cache, no request.
    assert fetch_libsvm("a1a", cache_dir=cache, base_url=base_url) == path
    assert requests == ["/binary/a1a"]
    X, y = load_libsvm(path, n_features=123)
    assert X.shape == (1605, 123) and X.nnz == 22249
    assert _no_partial_files(cache)


def test_load_by_name_downloads_once(mirror, tmp_path, monkeypatch):
    base_url, root, requests = mirror
    shutil.copyfile(LIBSVM / "a9a", root / "binary" / "a9a")
    monkeypatch.setenv("AMOPT_DATA_DIR", str(tmp_path / "env-home"))
    assert get_data_home() == tmp_path / "env-home"
    X, y = load_libsvm("a9a", base_url=base_url, labels="binary")
    assert X.shape == (32561, 123)
    assert int((y == 1).sum()) == 7841
    assert (tmp_path / "env-home" / "libsvm" / "a9a").is_file()
    load_libsvm("a9a", base_url=base_url)
    assert requests == ["/binary/a9a"]


def test_corrupted_download_is_deleted(mirror, tmp_path):
    base_url, root, _ = mirror
    data = bytearray((LIBSVM / "a1a").read_bytes())
    data[100] ^= 0x01  # one flipped bit
    (root / "binary" / "a1a").write_bytes(bytes(data))
    cache = tmp_path / "cache"
    url = f"{base_url}binary/a1a"
    with pytest.raises(ChecksumError, match=re.escape(url) + ".*expected " + "eb54c45f"):
        fetch_libsvm("a1a", cache_dir=cache, base_url=base_url)
    assert not (cache / "libsvm" / "a1a").exists()
    assert _no_partial_files(cache)
    # verify=False accepts it (e.g. a deliberately modified mirror).
    path = fetch_libsvm("a1a", cache_dir=cache, base_url=base_url, verify=False)
    assert path.read_bytes() == bytes(data)


def test_http_error_and_unreachable_url(mirror, tmp_path):
    base_url, _, _ = mirror
    cache = tmp_path / "cache"
    with pytest.raises(
        DownloadError, match=re.escape(f"{base_url}binary/a1a: the server answered HTTP 404")
    ):
        fetch_libsvm("a1a", cache_dir=cache, base_url=base_url)
    # A port nobody listens on: connection refused, reported with the URL and a manual fix.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/binary/w8a"
    with pytest.raises(DownloadError) as info:
        fetch_libsvm("w8a", cache_dir=cache, base_url=f"http://127.0.0.1:{port}", timeout=5)
    msg = str(info.value)
    assert f"could not download {url}" in msg
    assert "you may be offline" in msg
    assert f"place it at {cache / 'libsvm' / 'w8a'}" in msg and "AMOPT_DATA_DIR" in msg
    assert not (cache / "libsvm" / "w8a").exists()
    assert _no_partial_files(cache)


def test_download_false_and_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="download=False"):
        fetch_libsvm("w8a", cache_dir=tmp_path, download=False)
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        fetch_libsvm("w8a", cache_dir=tmp_path, timeout=0)
    with pytest.raises(KeyError, match="unknown LIBSVM data set"):
        fetch_libsvm("not-a-set", cache_dir=tmp_path)
    with pytest.raises(TypeError, match="cache_dir must be a path or None"):
        get_data_home(3)
