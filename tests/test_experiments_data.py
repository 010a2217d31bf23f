"""Data loaders of ``amopt.experiments``: Fashion-MNIST (IDX), text, LIBSVM sets, missing paths."""

from __future__ import annotations

import gzip
import hashlib
import struct

import numpy as np
import pytest

from amopt.datasets import fetch_libsvm
from amopt.experiments import _data
from amopt.experiments._data import (
    ENV_VAR,
    FASHION_MNIST_FILES,
    TEXT_SHA256,
    data_folder,
    fetch_text,
    find_fashion_mnist,
    load_fashion_mnist,
    load_logreg_problem,
    load_text,
    read_idx,
    split_text,
)


@pytest.fixture
def no_debian_copy(monkeypatch, tmp_path):
    """Hide /usr/share/datasets/fashion-mnist so that only the given folders are searched."""
    monkeypatch.setattr(_data, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian-copy")


def _write_idx(path, array: np.ndarray, compress: bool = True) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if compress:
        with gzip.open(path, "wb") as fh:
            fh.write(payload)
    else:
        path.write_bytes(payload)


# --------------------------------------------------------------------------- Fashion-MNIST


def test_fashion_mnist_real_files(data_dir):
    if not (data_dir / "fashion-mnist" / FASHION_MNIST_FILES[0]).is_file():
        pytest.skip("Fashion-MNIST not in the shared data folder")
    x_train, y_train, x_test, y_test = load_fashion_mnist(data_dir)
    assert x_train.shape == (60000, 28, 28) and x_train.dtype == np.uint8
    assert y_train.shape == (60000,) and y_train.dtype == np.uint8
    assert x_test.shape == (10000, 28, 28) and x_test.dtype == np.uint8
    assert y_test.shape == (10000,)
    # ten balanced classes 0..9, and real images (not blank)
    assert np.array_equal(np.bincount(y_train, minlength=10), np.full(10, 6000))
    assert np.array_equal(np.bincount(y_test, minlength=10), np.full(10, 1000))
    assert int(x_train.max()) == 255 and int(x_train.min()) == 0
    assert 0.2 < float(x_train.mean()) / 255 < 0.4


def test_fashion_mnist_found_directly_in_a_folder(tmp_path, no_debian_copy):
    rng = np.random.default_rng(0)
    for name in FASHION_MNIST_FILES:
        n = 5 if name.startswith("train") else 3
        arr = rng.integers(0, 256, (n, 28, 28)) if "images" in name else rng.integers(0, 10, n)
        _write_idx(tmp_path / name, arr)
    assert find_fashion_mnist(tmp_path) == tmp_path
    x_train, y_train, x_test, y_test = load_fashion_mnist(tmp_path)
    assert x_train.shape == (5, 28, 28) and y_test.shape == (3,)


def test_fashion_mnist_missing_path_says_where_to_put_the_files(tmp_path, no_debian_copy):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as info:
        load_fashion_mnist(missing)
    msg = str(info.value)
    assert str(missing / "fashion-mnist") in msg
    assert "train-images-idx3-ubyte.gz" in msg and "t10k-labels-idx1-ubyte.gz" in msg
    assert "--data-dir" in msg and ENV_VAR in msg
    assert "dataset-fashion-mnist" in msg


def test_read_idx_roundtrip_and_errors(tmp_path):
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "a.gz", arr)
    _write_idx(tmp_path / "a", arr, compress=False)
    assert np.array_equal(read_idx(tmp_path / "a.gz"), arr)
    assert np.array_equal(read_idx(tmp_path / "a"), arr)
    (tmp_path / "bad").write_bytes(b"\x00\x00\x0d\x01\x00\x00\x00\x01\x00\x00\x00\x00")
    with pytest.raises(ValueError, match="unsigned-byte IDX"):
        read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 10) + b"abc")
    with pytest.raises(ValueError, match="header says"):
        read_idx(tmp_path / "short")


def test_fashion_mnist_rejects_bad_labels(tmp_path, no_debian_copy):
    for name in FASHION_MNIST_FILES:
        arr = np.zeros((2, 28, 28)) if "images" in name else np.array([3, 12])
        _write_idx(tmp_path / name, arr)
    with pytest.raises(ValueError, match="outside 0..9"):
        load_fashion_mnist(tmp_path)


# --------------------------------------------------------------------------- text


def test_text_loader_reads_tiny_shakespeare(data_dir):
    if not (data_dir / "text" / "tinyshakespeare" / "input.txt").is_file():
        pytest.skip("tiny-shakespeare not in the shared data folder")
    data = load_text(data_dir=data_dir)
    assert data.dtype == np.uint8 and data.shape == (1115394,)
    assert hashlib.sha256(data.tobytes()).hexdigest() == TEXT_SHA256
    assert bytes(data[:9]) == b"First Cit"
    assert len(np.unique(data)) == 65
    train, val = split_text(data, 0.1)
    assert len(train) + len(val) == len(data)
    assert len(val) == round(0.1 * len(data))
    assert np.array_equal(np.concatenate([train, val]), data)


def test_text_loader_explicit_path_and_split(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes("héllo world".encode())
    data = load_text(f)
    assert bytes(data).decode() == "héllo world" and data.max() > 127  # bytes, not chars
    with pytest.raises(ValueError):
        split_text(data, 1.0)


def test_text_missing_path_says_where_to_put_the_file(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        load_text(data_dir=tmp_path, download=False)
    msg = str(info.value)
    assert f"not found at {tmp_path / 'text' / 'tinyshakespeare' / 'input.txt'}" in msg
    assert "--data-dir" in msg and ENV_VAR in msg and "--no-download" in msg
    assert "libsvm/" in msg and "fashion-mnist/" in msg  # the whole layout
    assert not (tmp_path / "text").exists()  # nothing was downloaded or created
    with pytest.raises(FileNotFoundError, match="not found"):
        load_text(tmp_path / "absent.txt")


def test_text_download_is_verified_and_cached(tmp_path, monkeypatch, data_dir):
    """The download path, served from the shared copy through a file:// URL."""
    source = data_dir / "text" / "tinyshakespeare" / "input.txt"
    if not source.is_file():
        pytest.skip("tiny-shakespeare not in the shared data folder")
    monkeypatch.setattr(_data, "TEXT_URL", source.as_uri())
    path = fetch_text(tmp_path)
    assert path == tmp_path / "text" / "tinyshakespeare" / "input.txt"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == TEXT_SHA256
    monkeypatch.setattr(_data, "TEXT_URL", (tmp_path / "gone").as_uri())
    assert load_text(data_dir=tmp_path).shape == (1115394,)  # cached: no second download


def test_text_download_with_a_wrong_checksum_is_rejected(tmp_path, monkeypatch):
    bogus = tmp_path / "bogus.txt"
    bogus.write_text("not the corpus")
    monkeypatch.setattr(_data, "TEXT_URL", bogus.as_uri())
    with pytest.raises(FileNotFoundError) as info:
        fetch_text(tmp_path / "data")
    msg = str(info.value)
    assert "The download failed" in msg and TEXT_SHA256 in msg and "--data-dir" in msg
    assert not (tmp_path / "data" / "text" / "tinyshakespeare" / "input.txt").exists()


# --------------------------------------------------------------------------- folders, LIBSVM


def test_data_folder_order(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env"))
    assert data_folder(tmp_path / "explicit") == tmp_path / "explicit"
    assert data_folder() == tmp_path / "env"
    monkeypatch.delenv(ENV_VAR)
    monkeypatch.delenv("AMOPT_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr("platform.system", lambda: "Linux")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_folder() == tmp_path / "home" / ".cache" / "amopt"
    # without a data folder, the user cache directory: AMOPT_CACHE_DIR if set
    monkeypatch.setenv("AMOPT_CACHE_DIR", str(tmp_path / "cache"))
    assert data_folder() == tmp_path / "cache"


@pytest.mark.parametrize(
    ("name", "shape"),
    [("phishing", (7738, 68)), ("ijcnn1", (49990, 22)), ("madelon", (2000, 500))],
)
def test_logreg_sets_from_the_shared_folder(data_dir, name, shape):
    rel = _data.LIBSVM_SETS[name][0]
    if not (data_dir / rel).is_file():
        pytest.skip(f"{rel} not in the shared data folder")
    short, prob, source = load_logreg_problem(name, data_dir)
    assert short == name and source == str(data_dir / rel)
    assert (prob.n_samples, prob.n_features) == shape
    assert prob.kind == "binary" and prob.L > 0


def test_logreg_bundled_fallback_and_missing_message(tmp_path):
    name, prob, source = load_logreg_problem("mushrooms", tmp_path)  # not there: bundled copy
    assert source == "bundled:mushrooms" and prob.n_samples == 8124
    name, prob, source = load_logreg_problem("a1a", tmp_path)
    assert source == "bundled:a1a" and prob.n_samples == 1605
    with pytest.raises(FileNotFoundError) as info:
        load_logreg_problem("a9a", tmp_path, download=False)
    msg = str(info.value)
    assert f"not found at {tmp_path / 'libsvm' / 'a9a'}" in msg
    assert "--data-dir" in msg and ENV_VAR in msg and "download=False" in msg
    with pytest.raises(FileNotFoundError, match="not an existing file"):
        load_logreg_problem(str(tmp_path / "no-such-file"), tmp_path)


def test_logreg_registry_download_lands_in_the_data_folder(tmp_path, data_dir):
    """A set missing from the folder comes through amopt.datasets, cached in <data>/libsvm."""
    source = data_dir / "libsvm" / "madelon.t"
    if not source.is_file():
        pytest.skip("madelon.t not in the shared data folder")
    mirror = tmp_path / "mirror" / "binary"
    mirror.mkdir(parents=True)
    (mirror / "madelon.t").write_bytes(source.read_bytes())
    fetch_libsvm("madelon.t", cache_dir=tmp_path / "data", base_url=(tmp_path / "mirror").as_uri())
    name, prob, src = load_logreg_problem("madelon.t", tmp_path / "data", download=False)
    assert (name, src) == ("madelon.t", "amopt.datasets:madelon.t")
    assert (prob.n_samples, prob.n_features) == (600, 500)


def test_logreg_file_path_and_unknown_name(tmp_path):
    f = tmp_path / "tiny.svm"
    f.write_text("1 1:0.5 3:1\n-1 2:1\n")
    name, prob, source = load_logreg_problem(str(f))
    assert (name, source) == ("tiny.svm", str(f))
    assert (prob.n_samples, prob.n_features) == (2, 3)
    with pytest.raises(FileNotFoundError) as info:
        load_logreg_problem("no-such-set", tmp_path)
    assert "registered amopt.datasets name" in str(info.value)
