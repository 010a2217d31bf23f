"""The download cache: checksums of cached files, recorded hashes, cut-short downloads and an
unwritable data directory, against an HTTP server on 127.0.0.1 only."""

from __future__ import annotations

import bz2
import functools
import hashlib
import http.server
import os
import re
import threading
from pathlib import Path

import pytest

import amopt.datasets
from amopt.datasets import (
    ChecksumError,
    DownloadError,
    dataset_info,
    fetch_libsvm,
    load_libsvm,
)

# A registered set without a checksum in the registry, and one with.
NO_HASH = "heart"
#: the registry's number of samples of NO_HASH: a file without a checksum must hold them
ROWS = dataset_info(NO_HASH).n_samples
BUNDLED_A1A = Path(amopt.datasets.__file__).parent / "data" / "a1a.bz2"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _libsvm_text(n_rows: int, n_features: int) -> bytes:
    lines = []
    for i in range(n_rows):
        feats = " ".join(f"{j}:{(i * j) % 7 - 3}" for j in range(1, n_features + 1, 2))
        lines.append(f"{1 if i % 3 else -1} {feats}")
    return ("\n".join(lines) + "\n").encode()


class _Handler(http.server.SimpleHTTPRequestHandler):
    requests: list[str]
    cut_short: bool = False

    def log_message(self, *args):  # keep the test output clean
        pass

    def do_GET(self):
        type(self).requests.append(self.path)
        if not type(self).cut_short:
            return super().do_GET()
        # Announce the whole file, send half of it, then drop the connection.
        body = Path(self.translate_path(self.path)).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def mirror(tmp_path):
    """A LIBSVM-layout mirror on 127.0.0.1; yields (base_url, root, handler class)."""
    root = tmp_path / "mirror"
    (root / "binary").mkdir(parents=True)
    handler = type("Handler", (_Handler,), {"requests": [], "cut_short": False})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", root, handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _serve(root: Path, name: str, data: bytes) -> None:
    target = root / dataset_info(name).path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*") if p.name.endswith(".part"))


def test_download_without_registered_hash_records_one(mirror, tmp_path):
    base_url, root, handler = mirror
    assert dataset_info(NO_HASH).sha256 is None
    data = _libsvm_text(ROWS, 13)
    _serve(root, NO_HASH, data)
    cache = tmp_path / "cache"
    path = fetch_libsvm(NO_HASH, cache_dir=cache, base_url=base_url)
    sidecar = path.with_name(path.name + ".sha256")
    assert path.read_bytes() == data
    assert sidecar.read_text().split() == [_sha(data), path.name]
    X, y = load_libsvm(NO_HASH, cache_dir=cache, download=False)
    assert X.shape == (ROWS, 13) and len(y) == ROWS
    assert handler.requests == ["/binary/heart_scale"]
    assert _leftovers(cache) == []


def test_truncated_cache_file_is_downloaded_again(mirror, tmp_path):
    base_url, root, handler = mirror
    data = _libsvm_text(ROWS, 13)
    _serve(root, NO_HASH, data)
    cache = tmp_path / "cache"
    path = fetch_libsvm(NO_HASH, cache_dir=cache, base_url=base_url)
    cut = data[: data.index(b"\n", len(data) // 2) + 1]  # whole lines: it would parse
    path.write_bytes(cut)
    with pytest.warns(UserWarning) as record:
        X, y = load_libsvm(NO_HASH, cache_dir=cache, base_url=base_url)
    msg = str(record[0].message)
    assert f"cached file {path} has sha256 {_sha(cut)}, expected {_sha(data)}" in msg
    assert X.shape[0] == data.count(b"\n") == ROWS  # all rows, not the truncated copy's
    assert path.read_bytes() == data
    assert path.with_name(path.name + ".corrupt").read_bytes() == cut  # kept, not deleted
    assert handler.requests == ["/binary/heart_scale"] * 2


def test_truncated_cache_file_without_download_names_file_and_both_hashes(mirror, tmp_path):
    base_url, root, handler = mirror
    data = _libsvm_text(ROWS, 13)
    _serve(root, NO_HASH, data)
    cache = tmp_path / "cache"
    path = fetch_libsvm(NO_HASH, cache_dir=cache, base_url=base_url)
    path.write_bytes(data[:-20])
    with pytest.raises(ChecksumError) as info:
        load_libsvm(NO_HASH, cache_dir=cache, download=False)
    msg = str(info.value)
    assert str(path) in msg and _sha(data[:-20]) in msg and _sha(data) in msg
    assert path.read_bytes() == data[:-20]  # left as it was
    assert handler.requests == ["/binary/heart_scale"]


def test_corrupt_file_with_registered_hash_is_replaced_by_a_verified_copy(mirror, tmp_path):
    base_url, root, handler = mirror
    data = bz2.decompress(BUNDLED_A1A.read_bytes())
    assert _sha(data) == dataset_info("a1a").sha256
    _serve(root, "a1a", data)
    cached = tmp_path / "libsvm" / "a1a"
    cached.parent.mkdir()
    flipped = bytearray(data)
    flipped[1000] ^= 0x04
    cached.write_bytes(bytes(flipped))
    with pytest.warns(UserWarning, match=re.escape(_sha(bytes(flipped)))):
        path = fetch_libsvm("a1a", cache_dir=tmp_path, base_url=base_url)
    assert path == cached and _sha(path.read_bytes()) == dataset_info("a1a").sha256
    assert handler.requests == ["/binary/a1a"]


def test_failed_redownload_keeps_the_cache_and_reports_both_hashes(mirror, tmp_path):
    base_url, root, handler = mirror
    data = _libsvm_text(ROWS, 13)
    _serve(root, NO_HASH, data)
    path = fetch_libsvm(NO_HASH, cache_dir=tmp_path, base_url=base_url)
    path.write_bytes(data[:50])
    _serve(root, NO_HASH, data + b"1 1:1\n")  # the mirror changed meanwhile
    with pytest.raises(ChecksumError) as info:
        fetch_libsvm(NO_HASH, cache_dir=tmp_path, base_url=base_url)
    msg = str(info.value)
    assert str(path) in msg and _sha(data[:50]) in msg and _sha(data) in msg
    assert "downloading it again failed" in msg and str(path) + ".sha256" in msg
    assert path.read_bytes() == data[:50]
    assert not path.with_name(path.name + ".corrupt").exists()
    assert _leftovers(tmp_path) == []


def test_download_cut_short_is_not_cached(mirror, tmp_path):
    base_url, root, handler = mirror
    data = _libsvm_text(200, 13)
    _serve(root, NO_HASH, data)
    handler.cut_short = True
    with pytest.raises(DownloadError, match=f"received {len(data) // 2} of {len(data)} bytes"):
        fetch_libsvm(NO_HASH, cache_dir=tmp_path, base_url=base_url)
    assert not (tmp_path / "libsvm" / "heart_scale").exists()
    assert not (tmp_path / "libsvm" / "heart_scale.sha256").exists()
    assert _leftovers(tmp_path) == []


def test_data_dir_that_is_a_file_names_the_variable_and_path(mirror, tmp_path, monkeypatch):
    base_url, root, handler = mirror
    _serve(root, NO_HASH, _libsvm_text(5, 13))
    not_a_dir = tmp_path / "data-home"
    not_a_dir.write_text("a file, not a directory")
    monkeypatch.setenv("AMOPT_DATA_DIR", str(not_a_dir))
    with pytest.raises(OSError) as info:
        load_libsvm(NO_HASH, base_url=base_url)
    msg = str(info.value)
    assert f"cannot write to the amopt data directory {not_a_dir / 'libsvm'}" in msg
    assert f"AMOPT_DATA_DIR={str(not_a_dir)!r}" in msg
    assert not isinstance(info.value, DownloadError)
    assert handler.requests == []  # no network when nothing can be stored
    # Chosen by cache_dir=, which wins over the variable: the message says so.
    with pytest.raises(OSError) as info:
        fetch_libsvm(NO_HASH, cache_dir=not_a_dir, base_url=base_url)
    msg = str(info.value)
    assert f"cache_dir={str(not_a_dir)!r}" in msg and "AMOPT_DATA_DIR" in msg
    # The default directory (variable unset) is named with the variable to set.
    monkeypatch.delenv("AMOPT_DATA_DIR")
    monkeypatch.delenv("AMOPT_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr("platform.system", lambda: "Linux")
    monkeypatch.setenv("HOME", str(not_a_dir))
    with pytest.raises(OSError) as info:
        fetch_libsvm(NO_HASH, base_url=base_url)
    msg = str(info.value)
    assert str(not_a_dir / ".cache" / "amopt" / "libsvm") in msg
    assert "the AMOPT_DATA_DIR environment variable is not set" in msg


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write anywhere"
)
def test_read_only_data_dir_names_the_variable_and_path(mirror, tmp_path, monkeypatch):
    base_url, root, _ = mirror
    _serve(root, NO_HASH, _libsvm_text(5, 13))
    home = tmp_path / "ro"
    home.mkdir()
    home.chmod(0o500)
    monkeypatch.setenv("AMOPT_DATA_DIR", str(home))
    try:
        with pytest.raises(PermissionError, match="AMOPT_DATA_DIR") as info:
            fetch_libsvm(NO_HASH, base_url=base_url)
        assert str(home / "libsvm") in str(info.value)
    finally:
        home.chmod(0o700)


def _tree(root: Path) -> dict:
    """Every path under ``root`` with its size and modification time (a write changes it)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    } | {".": root.stat().st_mtime_ns}


def test_file_placed_by_hand_in_a_data_folder_is_recorded_in_the_cache_dir(tmp_path, monkeypatch):
    """A data folder (AMOPT_DATA_DIR, maybe shared) is only read: the SHA-256 recorded for
    a copy placed there by hand goes to AMOPT_CACHE_DIR, and guards the copy as before."""
    data, cache = tmp_path / "data", tmp_path / "cache"
    placed = data / "libsvm" / dataset_info(NO_HASH).file_name
    placed.parent.mkdir(parents=True)
    text = _libsvm_text(ROWS, 13)
    placed.write_bytes(text)
    monkeypatch.setenv("AMOPT_DATA_DIR", str(data))
    monkeypatch.setenv("AMOPT_CACHE_DIR", str(cache))
    before = _tree(data)
    assert fetch_libsvm(NO_HASH, download=False) == placed
    X, _ = load_libsvm(NO_HASH, download=False)
    assert X.shape[0] == ROWS
    assert _tree(data) == before  # nothing written or touched in the data folder
    (record,) = (cache / "checksums").glob(f"*-{placed.name}.sha256")
    assert record.read_text().split()[0] == _sha(text)
    # the recorded hash guards the copy: a later truncation is a hash mismatch naming it
    placed.write_bytes(text[:-40])
    with pytest.raises(ChecksumError, match="has sha256") as info:
        fetch_libsvm(NO_HASH, download=False)
    assert str(record) in str(info.value) and _sha(text) in str(info.value)
