"""LIBSVM loading: every offline file, the bundled copies, label maps, malformed files."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")

from amopt.datasets import (  # noqa: E402
    ChecksumError,
    binary_labels,
    class_indices,
    dataset_info,
    list_datasets,
    load_libsvm,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
LIBSVM = DATA / "libsvm"
needs_data = pytest.mark.skipif(
    not LIBSVM.is_dir(), reason=f"offline LIBSVM data directory {LIBSVM} is absent"
)

# From ../shared/data/README.md: file, n, d inferred by load_svmlight_file, d on the LIBSVM
# page, nnz, label counts, sha256, zero-based indices.
_A = {-1: 24720, 1: 7841}
TABLE = [
    ("a9a", 32561, 123, 123, 451592, _A,
     "f5d5ffd8d865ff41328e7ee043e4b020816914ff6843ff15b98905ddbedce906", False),
    ("a9a.t", 16281, 122, 123, 225731, {-1: 12435, 1: 3846},
     "1f448a153f0320399a7e40836eb207655b0bde0f21fc941cc472193daa9f5de9", False),
    ("a1a", 1605, 119, 123, 22249, {-1: 1210, 1: 395},
     "eb54c45f1bdb51286f803dd092eb8202b44637a858fc6c4e533a2d64a0d94b4e", False),
    ("w8a", 49749, 300, 300, 579586, {-1: 48270, 1: 1479},
     "6a9fa8fd5f524303240a5db07d4b3d4a51e8b7b4b20a914105d8e3e8c81640f2", False),
    ("w8a.t", 14951, 300, 300, 174276, {-1: 14497, 1: 454},
     "618929ecb01bebb841daec4cae4aa07b97832d29b08652452775598929547fde", False),
    ("mushrooms", 8124, 112, 112, 170604, {1: 3916, 2: 4208},
     "f39a4eb628dc61a7d43760815b061c9e497aa728ce1ad8bde57a09ef6043b538", False),
    ("ijcnn1.trn.bz2", 49990, 22, 22, 649870, {-1: 45137, 1: 4853},
     "b38a4198ce142d43e96fb86d17b87211feec1f909ac344fa057455c69de29de3", False),
    ("ijcnn1.tst.bz2", 91701, 22, 22, 1192113, {-1: 82989, 1: 8712},
     "acd1db430684fdd3f0c768ecc49aa8e749d0004fc117611220c2aa576a7b6a24", False),
    ("madelon.t", 600, 500, 500, 300000, {-1: 300, 1: 300},
     "ae60251b63a46c6ace348b77749e79e25d4098d629d1dead2852c3d4daf1f8ea", False),
    ("news20.bz2", 15935, 62061, 62061, 1272569, None,
     "8c79851f6f5fdc5540a0d04a5ab728353c42d26b84e73f93bda301c06c15ffe9", False),
    ("dna.scale", 2000, 180, 180, 91233, {1: 464, 2: 485, 3: 1051},
     "03d39477c5e48415e9cd18e006efc8f7a3b5c3deaee8289a72511c35070e3cfe", False),
    ("dna.scale.t", 1186, 180, 180, 53669, {1: 303, 2: 280, 3: 603},
     "d2eeed170e4e38ae2aba6aa4cd27a8ca4ecceb01a7751e8e509bb4e1a6bcef39", False),
    ("pendigits", 7494, 16, 16, 104535,
     {0: 780, 1: 779, 2: 780, 3: 719, 4: 780, 5: 720, 6: 720, 7: 778, 8: 719, 9: 719},
     "6e8a2f318a24d97d26a9c381642621dc955fed73ec44c4d417bd7afbb47ed67c", False),
    ("pendigits.t", 3498, 16, 16, 48773,
     {0: 363, 1: 364, 2: 364, 3: 336, 4: 364, 5: 335, 6: 336, 7: 364, 8: 336, 9: 336},
     "5ddb2f034e1c5ca8a47b8a7e78510f8a9d68015cf40a5031534c693fba9773d3", False),
    ("letter.scale", 15000, 16, 16, 240000, None,
     "ce2c7df15cc5742dc4382d59079181c97c21e0beaa0af53c84cc5745c69f1020", False),
    ("letter.scale.t", 5000, 16, 16, 80000, None,
     "07522ccbf54187fae6d560d1712b88c41ea1f7e8d19491c5adcc22ee37a075da", False),
    ("variants/PanHaulin+CFNPM/phishing", 7738, 68, 68, 232140, {0: 3446, 1: 4292},
     "5ea66b2c584a427f8f65cd1a440766f83e2fb66975b04f62c0beca12b96298d2", True),
    ("variants/PanHaulin+CFNPM/phishing.t", 3317, 68, 68, 99510, {0: 1452, 1: 1865},
     "9c6201c9c9c791b7386f3db8d67144081b50cb90931c7dcf297cc45c5ad567c4", True),
    ("derived/madelon", 2000, 500, 500, 999999, {-1: 1000, 1: 1000},
     "34f9d790481f42d468c4a59515e6c7bb1dcfa5b0c5339e584b998db13f2d6464", False),
]  # fmt: skip
MULTICLASS_RANGE = {"news20.bz2": 20, "letter.scale": 26, "letter.scale.t": 26}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@needs_data
def test_table_covers_every_offline_file():
    on_disk = {p.relative_to(LIBSVM).as_posix() for p in LIBSVM.rglob("*") if p.is_file()}
    assert on_disk == {row[0] for row in TABLE}


@needs_data
@pytest.mark.parametrize("row", TABLE, ids=[r[0] for r in TABLE])
def test_every_offline_file_loads(row):
    rel, n, d_inferred, d_page, nnz, counts, sha, zero_based = row
    path = LIBSVM / rel
    assert _sha(path) == sha
    X, y = load_libsvm(path, n_features=d_page)
    assert X.shape == (n, d_page)
    assert X.nnz == nnz
    assert X.format == "csr" and X.has_sorted_indices
    if counts is not None:
        assert dict(Counter(y.tolist())) == counts
    else:  # multiclass 1..K, every class present
        assert sorted(set(y.tolist())) == list(range(1, MULTICLASS_RANGE[rel] + 1))
    # The README's inferred d is the largest index present (largest column + 1 after the
    # one-based shift, or for zero-based files the largest index + 1).
    assert int(X.indices.max()) + 1 == d_inferred
    if zero_based:  # "auto" detects zero-based indices, as the README says it should
        X3, _ = load_libsvm(path, n_features=d_page, zero_based=True)
        assert (X3 != X).nnz == 0


@needs_data
def test_zero_based_variant_is_detected_and_one_based_reading_is_rejected():
    path = LIBSVM / "variants/PanHaulin+CFNPM/phishing.t"
    lines = path.read_text().splitlines()
    row = next(i for i, line in enumerate(lines) if " 0:" in line)
    value = float(next(t for t in lines[row].split() if t.startswith("0:")).split(":")[1])
    X0, _ = load_libsvm(path, zero_based=True, n_features=68)
    assert X0[row, 0] == value  # feature index 0 is column 0
    Xauto, _ = load_libsvm(path, n_features=68)
    assert (Xauto != X0).nnz == 0
    with pytest.raises(
        ValueError, match=re.escape(f"{path}: line {row + 1}:") + ".*invalid feature index 0"
    ):
        load_libsvm(path, zero_based=False, n_features=69)


@needs_data
@pytest.mark.parametrize(
    ("name", "rel"),
    [("a9a", "a9a"), ("a9a.t", "a9a.t"), ("w8a", "w8a"), ("dna.t", "dna.scale.t"),
     ("news20", "news20.bz2"), ("madelon.t", "madelon.t")],
)  # fmt: skip
def test_registry_names_resolve_in_a_cache_dir(name, rel):
    # The offline data directory has the cache layout (<home>/libsvm/<file>), so names
    # resolve there with checksum verification and the registry's n_features.
    info = dataset_info(name)
    assert info.file_name == Path(rel).name
    assert info.sha256 == _sha(LIBSVM / rel)
    X, y = load_libsvm(name, cache_dir=DATA, download=False)
    row = next(r for r in TABLE if r[0] == rel)
    assert X.shape == (row[1], row[3]) == (info.n_samples, info.n_features)


@pytest.mark.parametrize(
    ("name", "shape", "labels", "sha"),
    [
        ("mushrooms", (8124, 112), {1.0: 3916, 2.0: 4208},
         "f39a4eb628dc61a7d43760815b061c9e497aa728ce1ad8bde57a09ef6043b538"),
        ("a1a", (1605, 123), {-1.0: 1210, 1.0: 395},
         "eb54c45f1bdb51286f803dd092eb8202b44637a858fc6c4e533a2d64a0d94b4e"),
    ],
)  # fmt: skip
def test_bundled_files_work_offline(name, shape, labels, sha, tmp_path, monkeypatch):
    monkeypatch.setenv("AMOPT_DATA_DIR", str(tmp_path / "empty"))  # nothing cached
    X, y = load_libsvm(name, download=False)
    assert X.shape == shape
    assert dict(Counter(y.tolist())) == labels
    import amopt.datasets

    bundled = Path(amopt.datasets.__file__).parent / "data" / dataset_info(name).bundled
    raw = bz2.decompress(bundled.read_bytes())
    assert hashlib.sha256(raw).hexdigest() == sha  # byte-identical to the LIBSVM file
    assert bundled.stat().st_size < 20_000  # keep the wheel small
    assert not (tmp_path / "empty").exists()


def test_label_modes():
    X, y = load_libsvm("mushrooms", labels="binary")
    raw = load_libsvm("mushrooms")[1]
    assert set(y.tolist()) == {-1.0, 1.0}
    np.testing.assert_array_equal(y == 1.0, raw == 2.0)  # the larger label is +1
    idx = load_libsvm("mushrooms", labels="index")[1]
    assert idx.dtype == np.int64
    np.testing.assert_array_equal(idx, (raw == 2.0).astype(np.int64))


def test_binary_labels_conventions():
    for y, expect in [
        ([-1, 1, 1], [-1, 1, 1]),
        ([0, 1, 0], [-1, 1, -1]),
        ([1, 2, 2], [-1, 1, 1]),
        ([2, 4, 2], [-1, 1, -1]),
        ([3, 3], [1, 1]),
    ]:
        np.testing.assert_array_equal(binary_labels(np.array(y)), expect)
    np.testing.assert_array_equal(binary_labels(np.array([0, 1]), positive=0), [1, -1])
    with pytest.raises(ValueError, match="at most 2 distinct values, got 3"):
        binary_labels(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="positive=5 does not occur"):
        binary_labels(np.array([1, 2]), positive=5)
    with pytest.raises(ValueError, match="1-D"):
        binary_labels(np.zeros((2, 2)))
    idx, classes = class_indices(np.array([5.0, -1.0, 5.0, 2.0]))
    np.testing.assert_array_equal(idx, [2, 0, 2, 1])
    np.testing.assert_array_equal(classes, [-1.0, 2.0, 5.0])


def test_registry_entries_are_consistent():
    names = list_datasets()
    assert len(names) == len(set(names)) >= 30
    for name in names:
        info = dataset_info(name)
        assert info.path.split("/")[0] in ("binary", "multiclass")
        assert info.url().startswith("https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/")
        assert info.n_samples > 0 and info.n_features > 0
        assert (info.labels == "multiclass") == (info.n_classes > 2)
        assert info.sha256 is None or len(info.sha256) == 64
    assert dataset_info("mushrooms").labels == "12"
    assert dataset_info("phishing").labels == "01"
    with pytest.raises(KeyError, match="unknown LIBSVM data set 'a10a'"):
        dataset_info("a10a")


# --------------------------------------------------------------------------- malformed files

MALFORMED = [
    ("badvalue", "1 1:0.5 2:1\n-1 1:1 2:abc\n", {}, "line 2:.*feature value in '2:abc'"),
    ("badlabel", "1 1:0.5\n\n# comment\nx 3:1\n", {}, "line 4:.*label 'x' is not a number"),
    ("unsorted", "1 1:0.5\n-1 3:1 2:1\n", {}, "line 2:.*sorted and unique \\(3 then 2\\)"),
    ("duplicate", "1 1:0.5 1:2\n", {}, "line 1:.*sorted and unique \\(1 then 1\\)"),
    ("nocolon", "1 1:0.5\n-1 1:2 3\n", {}, "line 2:.*token '3' is not of the form"),
    ("floatindex", "1 1.5:2\n", {}, "line 1:.*feature index in '1.5:2' is not an integer"),
    ("negative", "1 1:1\n1 2:1\n-1 -3:1\n", {}, "line 3:.*invalid feature index -3"),
    ("zeroindex", "1 1:1\n-1 0:1\n", {"zero_based": False}, "line 2:.*invalid feature index 0"),
    ("toofew", "1 1:1\n-1 7:1\n", {"n_features": 5},
     "line 2:.*feature index 7 needs n_features >= 7, got n_features=5"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "text", "kwargs", "match"), MALFORMED, ids=[m[0] for m in MALFORMED]
)
@pytest.mark.parametrize("compress", ["", ".bz2", ".gz"])
def test_malformed_file_error_names_file_and_line(tmp_path, name, text, kwargs, match, compress):
    path = tmp_path / (name + compress)
    data = text.encode()
    if compress == ".bz2":
        data = bz2.compress(data)
    elif compress == ".gz":
        data = gzip.compress(data)
    path.write_bytes(data)
    with pytest.raises(ValueError, match="malformed LIBSVM file") as info:
        load_libsvm(path, **kwargs)
    msg = str(info.value)
    assert str(path) in msg
    assert re.search(match, msg), msg
    assert "scikit-learn:" in msg


def test_truncated_bz2_and_empty_file(tmp_path):
    good = bz2.compress(b"1 1:1\n-1 2:1\n" * 2000)
    path = tmp_path / "trunc.bz2"
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*could not be decompressed"):
        load_libsvm(path)
    empty = tmp_path / "empty"
    empty.write_text("# only a comment\n")
    with pytest.raises(ValueError, match=re.escape(f"LIBSVM file {empty} contains no samples")):
        load_libsvm(empty)


def test_argument_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither an existing file nor a registered"):
        load_libsvm(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="'no-such-set' is neither"):
        load_libsvm("no-such-set")
    with pytest.raises(
        ValueError,
        match=re.escape("n_features must be a positive integer (at most 2**31) or None, got 0"),
    ):
        load_libsvm("a1a", n_features=0)
    with pytest.raises(ValueError, match="zero_based must be True, False or 'auto', got 1"):
        load_libsvm("a1a", zero_based=1)
    with pytest.raises(ValueError, match="labels must be 'raw', 'binary' or 'index'"):
        load_libsvm("a1a", labels="pm1")
    with pytest.raises(TypeError, match="path_or_name must be a str or path-like, got int"):
        load_libsvm(3)
    path = tmp_path / "three"
    path.write_text("1 1:1\n2 1:2\n3 2:1\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}: binary labels need at most 2")):
        load_libsvm(path, labels="binary")


def test_missing_sklearn_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match=r"pip install amopt\[data\]"):
        load_libsvm("a1a")


def test_cached_file_with_wrong_checksum_is_reported_not_loaded(tmp_path):
    cached = tmp_path / "libsvm" / "a9a"
    cached.parent.mkdir()
    cached.write_text("1 1:1\n")
    with pytest.raises(ChecksumError, match=re.escape(f"cached file {cached} has sha256")):
        load_libsvm("a9a", cache_dir=tmp_path, download=False)
    assert cached.exists()  # a file the user placed is never deleted
    X, _ = load_libsvm("a9a", cache_dir=tmp_path, verify=False)
    assert X.shape == (1, 123)
