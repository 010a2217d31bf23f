"""Label mapping of one-class files, strict LIBSVM values, and argument checks of the
datasets entry points."""

from __future__ import annotations

import bz2
import math
import re

import numpy as np
import pytest

pytest.importorskip("sklearn")

from amopt.datasets import (  # noqa: E402
    LibsvmDataset,
    binary_labels,
    class_indices,
    dataset_info,
    fetch_libsvm,
    get_data_home,
    load_libsvm,
)
from amopt.problems import LogisticRegression  # noqa: E402


def _write(path, rows):
    """Write ``(label, {index: value})`` rows as LIBSVM text; return (X dense, labels)."""
    lines = [
        " ".join([label] + [f"{j}:{v!r}" for j, v in sorted(feats.items())])
        for label, feats in rows
    ]
    path.write_text("\n".join(lines) + "\n")
    d = max(j for _, feats in rows for j in feats)
    X = np.zeros((len(rows), d))
    for i, (_, feats) in enumerate(rows):
        for j, v in feats.items():
            X[i, j - 1] = v
    return X


ROWS = [{1: 0.5, 3: -1.0}, {2: 2.0}, {1: -0.25, 2: 1.0, 3: 0.75}, {3: 1.5}]

# (label in the file, label_convention, expected sign): the rule documented in binary_labels.
ONE_CLASS = [
    ("-1", None, -1.0),
    ("+1", None, 1.0),
    ("1", None, 1.0),
    ("0", None, -1.0),
    ("2", None, 1.0),
    ("-1", "pm1", -1.0),
    ("1", "pm1", 1.0),
    ("0", "01", -1.0),
    ("1", "01", 1.0),
    ("1", "12", -1.0),
    ("2", "12", 1.0),
    ("2", "24", -1.0),
    ("4", "24", 1.0),
]


@pytest.mark.parametrize(("label", "convention", "sign"), ONE_CLASS)
def test_one_class_file_keeps_its_sign(tmp_path, label, convention, sign):
    path = tmp_path / "one-class"
    _write(path, [(label, feats) for feats in ROWS])
    kwargs = {} if convention is None else {"label_convention": convention}
    _, y = load_libsvm(path, labels="binary", **kwargs)
    np.testing.assert_array_equal(y, np.full(len(ROWS), sign))
    kwargs = {} if convention is None else {"convention": convention}
    np.testing.assert_array_equal(binary_labels(np.full(3, float(label)), **kwargs), sign)


def _logistic_loss(X, b, x):
    return float(np.mean(np.logaddexp(0.0, -b * (X @ x))))


@pytest.mark.parametrize(
    ("label", "convention", "sign"),
    [("-1", None, -1.0), ("0", None, -1.0), ("1", "12", -1.0), ("1", None, 1.0)],
)
def test_logistic_regression_from_a_one_class_file(tmp_path, label, convention, sign):
    path = tmp_path / "test-split"
    X = _write(path, [(label, feats) for feats in ROWS])
    kwargs = {} if convention is None else {"label_convention": convention}
    prob = LogisticRegression.from_libsvm(path, **kwargs)
    x = np.array([0.3, -1.1, 0.7])
    assert float(prob.fun(x)) == pytest.approx(_logistic_loss(X, sign, x), rel=1e-14)
    # The wrong sign gives a different objective, so the check above has teeth.
    assert abs(_logistic_loss(X, -sign, x) - _logistic_loss(X, sign, x)) > 0.1


def test_registry_convention_applies_to_a_one_class_cached_file(tmp_path):
    info = dataset_info("covtype.binary")  # labels {1, 2}, no registered checksum
    assert info.labels == "12" and info.sha256 is None
    cached = tmp_path / "libsvm" / info.file_name
    cached.parent.mkdir()
    text = "".join(f"1 {i + 1}:{0.5 * (i + 1)!r}\n" for i in range(6))
    cached.write_bytes(bz2.compress(text.encode()))
    # a 6-row stand-in for the 581012-row file: verify=False, or it is refused as truncated
    kw = {"cache_dir": tmp_path, "download": False, "verify": False}
    X, y = load_libsvm("covtype.binary", labels="binary", **kw)
    assert X.shape == (6, info.n_features)
    np.testing.assert_array_equal(y, -np.ones(6))
    prob = LogisticRegression.from_libsvm("covtype.binary", **kw)
    x = np.linspace(-1.0, 1.0, info.n_features)
    Xd = X.toarray()
    assert float(prob.fun(x)) == pytest.approx(_logistic_loss(Xd, -1.0, x), rel=1e-14)


def test_binary_labels_rejects_what_it_cannot_map():
    with pytest.raises(ValueError, match=r"y has labels \[0\.0, 1\.0\], but convention='12'"):
        binary_labels(np.array([0.0, 1.0]), convention="12")
    with pytest.raises(ValueError, match="convention must be one of 'pm1', '01', '12', '24'"):
        binary_labels(np.array([1.0]), convention="multiclass")
    with pytest.raises(ValueError, match="pass positive or convention, not both"):
        binary_labels(np.array([1.0]), positive=1.0, convention="pm1")
    with pytest.raises(ValueError, match=r"labels must be finite: y\[1\] = nan"):
        binary_labels(np.array([1.0, np.nan, 1.0]))
    with pytest.raises(ValueError, match=r"y\[0\] = inf"):
        class_indices(np.array([np.inf, 1.0]))
    with pytest.raises(TypeError, match="y must hold real numbers or strings.*complex128"):
        binary_labels(np.array([1j, 0j]))
    # positive may be absent from a one-class y (a split with only negatives) ...
    np.testing.assert_array_equal(binary_labels(np.array([1, 1]), positive=2), [-1.0, -1.0])
    # ... but not from a two-class one, where it is a typo.
    with pytest.raises(ValueError, match="positive=5 does not occur in y"):
        binary_labels(np.array([1, 2]), positive=5)


# --------------------------------------------------------------------------- strict parsing

BAD = [
    ("big-index", "1 1:1\n-1 2:1 3000000000:1\n", "line 2:.*index 3000000000 is too large"),
    ("huge-index", "1 99999999999999999999999:1\n", "line 1:.*feature index 9+ is too large"),
    ("nan-value", "1 1:1\n-1 2:nan\n", "line 2:.*feature value in '2:nan' is not finite"),
    ("inf-value", "1 1:inf\n", "line 1:.*feature value in '1:inf' is not finite"),
    ("overflow", "1 1:1\n\n1 1:1e400\n", "line 3:.*feature value in '1:1e400' is not finite"),
    ("nan-label", "1 1:1\nnan 1:2\n", "line 2:.*label 'nan' is not finite"),
    ("inf-label", "-inf 1:2\n", "line 1:.*label '-inf' is not finite"),
    ("bad-value", "1 1:1\n-1 3:abc\n", "line 2:.*feature value in '3:abc' is not a number"),
    ("bad-index", "1 x:1\n", "line 1:.*feature index in 'x:1' is not an integer"),
    ("no-label", "1 1:1\n1:2 3:4\n", "line 2:.*the label is missing"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "match"), BAD, ids=[b[0] for b in BAD])
def test_invalid_values_name_file_and_line(tmp_path, name, text, match):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_libsvm(path)
    assert type(info.value) is ValueError
    msg = str(info.value)
    assert str(path) in msg
    assert re.search(match, msg), msg


@pytest.mark.parametrize("text", ["", "\n\n", "# a comment\n   \n"])
def test_empty_file_names_the_file(tmp_path, text):
    path = tmp_path / "empty"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(f"LIBSVM file {path} contains no samples")):
        load_libsvm(path)


def test_largest_supported_index_still_loads(tmp_path):
    path = tmp_path / "wide"
    path.write_text(f"1 1:2.5 {2**31 - 1}:-1\n")
    X, y = load_libsvm(path)
    assert X.shape == (1, 2**31 - 1)
    assert X[0, 0] == 2.5 and X[0, 2**31 - 2] == -1.0


def test_float32_overflow_is_an_error(tmp_path):
    path = tmp_path / "big"
    path.write_text("1 1:1e39\n")  # finite in float64, inf in float32
    assert load_libsvm(path)[0][0, 0] == 1e39
    with pytest.raises(ValueError, match="does not fit in float32"):
        load_libsvm(path, dtype=np.float32)


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"name": ""}, "name must be a non-empty str without '/', got ''"),
        ({"name": "a/b"}, "name must be a non-empty str"),
        ({"path": "binary/"}, "path must be a relative file path"),
        ({"path": "../x"}, "path must be a relative file path"),
        ({"n_samples": 0}, "n_samples must be a positive int, got 0"),
        ({"n_features": 2.5}, "n_features must be a positive int, got 2.5"),
        ({"labels": "pm2"}, "labels must be 'pm1' or '01'"),
        ({"n_classes": 3}, "n_classes must be 2 for labels='pm1'"),
        ({"sha256": "abc"}, "sha256 must be None or 64 lowercase hexadecimal digits"),
    ],
)
def test_registry_entry_fields_are_checked(change, match):
    fields = {"name": "x", "path": "binary/x", "n_samples": 3, "n_features": 2, "labels": "pm1"}
    LibsvmDataset(**fields)  # valid
    with pytest.raises(ValueError, match=re.escape(match)):
        LibsvmDataset(**{**fields, **change})


def test_entry_point_arguments(tmp_path):
    with pytest.raises(ValueError, match="cache_dir must be a non-empty path or None, got ''"):
        get_data_home("")
    with pytest.raises(ValueError, match="dtype must be a floating dtype.*int64"):
        load_libsvm("a1a", dtype=np.int64)
    with pytest.raises(ValueError, match="label_convention must be one of .*got 'pm'"):
        load_libsvm("a1a", labels="binary", label_convention="pm")
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        fetch_libsvm("w8a", cache_dir=tmp_path, timeout=True)
    with pytest.raises(TypeError, match="base_url must be a str or None, got int"):
        fetch_libsvm("w8a", cache_dir=tmp_path, base_url=3)
    with pytest.raises(ValueError, match=re.escape("n_features must be a positive integer")):
        load_libsvm("a1a", n_features=2**31 + 1)


def test_loaded_values_match_an_independent_parse(tmp_path):
    path = tmp_path / "small.bz2"
    rows = [("2", {1: 0.5, 4: -3.0}), ("1", {2: 1e-300}), ("2", {3: 7.0, 4: math.pi})]
    text = "".join(
        " ".join([lab] + [f"{j}:{v!r}" for j, v in sorted(f.items())]) + "\n" for lab, f in rows
    )
    path.write_bytes(bz2.compress(text.encode()))
    X, y = load_libsvm(path, labels="binary", label_convention="12")
    dense = np.zeros((3, 4))
    for i, (_, feats) in enumerate(rows):
        for j, v in feats.items():
            dense[i, j - 1] = v
    assert X.format == "csr"
    np.testing.assert_array_equal(X.toarray(), dense)
    np.testing.assert_array_equal(y, [1.0, -1.0, 1.0])
