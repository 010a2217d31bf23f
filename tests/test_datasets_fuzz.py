"""Property test: the LIBSVM loader returns a valid matrix or raises ValueError, whatever the
bytes of the file."""

from __future__ import annotations

import bz2
import gzip

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("sklearn")

from amopt.datasets import load_libsvm  # noqa: E402

_SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

_numbers = st.one_of(
    st.integers(-3, 3).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["+1", "-0", "1e400", "-1e-400", "nan", "inf", "-inf", "1_0", "0x10", "1.5"]),
)
_indices = st.one_of(
    st.integers(-2, 40),
    st.integers(2**31 - 3, 2**31 + 3),
    st.integers(-(2**70), 2**70),
).map(str)
_junk = st.text(alphabet=" \t:#x.-+e\x00\xff", max_size=4)
_token = st.one_of(
    st.tuples(_indices, _numbers).map(":".join),
    st.tuples(_indices, _numbers, _numbers).map(":".join),
    _junk,
    st.just("qid:3"),
)
_line = st.tuples(st.one_of(_numbers, _junk, st.just("")), st.lists(_token, max_size=5)).map(
    lambda t: " ".join([t[0], *t[1]])
)
_near_valid = st.lists(_line, max_size=6).map(lambda lines: "\n".join(lines).encode("utf-8"))


def _check(path, **kwargs):
    try:
        X, y = load_libsvm(path, **kwargs)
    except ValueError as exc:
        assert str(path) in str(exc)  # every error names the file
        return
    assert X.format == "csr"
    assert X.shape[0] == y.shape[0] >= 1
    assert X.shape[1] >= 1
    assert np.all(np.isfinite(X.data)) and np.all(np.isfinite(y))
    assert X.indices.size == X.nnz and np.all(X.indices < X.shape[1])


@_SETTINGS
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes(tmp_path, data):
    path = tmp_path / "fuzz"
    path.write_bytes(data)
    _check(path)


@_SETTINGS
@given(
    data=_near_valid,
    zero_based=st.sampled_from([True, False, "auto"]),
    n_features=st.sampled_from([None, 1, 5, 50]),
)
def test_near_valid_text(tmp_path, data, zero_based, n_features):
    path = tmp_path / "fuzz"
    path.write_bytes(data)
    _check(path, zero_based=zero_based, n_features=n_features)


@_SETTINGS
@given(data=_near_valid, suffix=st.sampled_from([".gz", ".bz2"]), cut=st.integers(0, 60))
def test_compressed_and_truncated(tmp_path, data, suffix, cut):
    packed = gzip.compress(data) if suffix == ".gz" else bz2.compress(data)
    path = tmp_path / ("fuzz" + suffix)
    path.write_bytes(packed[: max(len(packed) - cut, 0)])
    _check(path)
