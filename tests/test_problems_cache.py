"""The on-disk cache of reference solutions (x*, f*): damaged, stale or foreign entries are
recomputed, never trusted and never a crash; entries are written atomically."""

from __future__ import annotations

import errno
import io

import numpy as np
import pytest
import scipy.optimize

from amopt.problems import LogisticRegression, _reference

L2 = 0.05


def _data():
    rng = np.random.default_rng(11)
    X = rng.standard_normal((60, 5)) + 0.2
    y = np.where(X @ rng.standard_normal(5) + 0.5 * rng.standard_normal(60) > 0, 1.0, -1.0)
    return X, y


@pytest.fixture
def solve(tmp_path, monkeypatch):
    """Solve with the disk cache in tmp_path, as a fresh process would (empty memory cache)."""
    X, y = _data()

    def run():
        monkeypatch.setattr(_reference, "_MEMORY", {})
        return LogisticRegression(X, y, l2=L2).reference_solution(cache_dir=tmp_path)

    return run


@pytest.fixture(scope="module")
def exact():
    """The minimiser by an independent solver (BFGS on the same objective, written out)."""
    X, y = _data()
    n = X.shape[0]

    def fg(w):
        m = y * (X @ w)
        f = np.mean(np.logaddexp(0.0, -m)) + 0.5 * L2 * w @ w
        g = X.T @ (-y * np.exp(-np.logaddexp(0.0, m))) / n + L2 * w
        return f, g

    res = scipy.optimize.minimize(fg, np.zeros(5), jac=True, method="BFGS", tol=1e-13)
    return res.x, float(res.fun)


def _npz(**fields) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **fields)
    return buf.getvalue()


def _valid_fields(x, fun):
    return {"format": 1, "x": x, "fun": fun, "grad_norm": 0.0, "gtol": 1e-10, "converged": True}


def _corruptions(good: bytes, x: np.ndarray, fun: float) -> dict[str, bytes]:
    ok = _valid_fields(x, fun)
    return {
        "truncated": good[: len(good) // 2],  # zipfile.BadZipFile
        "truncated-header": good[:10],
        "empty": b"",  # EOFError
        "garbage": b"not an npz file at all",
        "missing-x": _npz(**{k: v for k, v in ok.items() if k != "x"}),
        "no-format": _npz(**{k: v for k, v in ok.items() if k != "format"}),
        "other-format": _npz(**{**ok, "format": 99}),
        "wrong-shape": _npz(**{**ok, "x": np.append(x, 0.0)}),
        "2-d-x": _npz(**{**ok, "x": x[None, :]}),
        "int-x": _npz(**{**ok, "x": np.round(x).astype(np.int64)}),
        "nan-x": _npz(**{**ok, "x": np.where(np.arange(x.size) == 2, np.nan, x)}),
        "nan-fun": _npz(**{**ok, "fun": np.nan}),
        "nan-grad-norm": _npz(**{**ok, "grad_norm": np.nan}),
        "array-fun": _npz(**{**ok, "fun": np.array([fun, fun])}),
        "string-fun": _npz(**{**ok, "fun": np.array("0.1")}),
        "stale-x": _npz(**{**ok, "x": x + 0.5}),  # claims grad_norm 0, is not a minimiser
    }


def test_valid_entry_is_reused(solve, exact, tmp_path):
    first = solve()
    assert first.nit > 0 and first.converged
    x_exact, f_exact = exact
    assert first.fun == pytest.approx(f_exact, abs=1e-13)
    np.testing.assert_allclose(first.x, x_exact, atol=1e-7)
    again = solve()
    assert again.nit == 0 and again.fun == first.fun
    np.testing.assert_array_equal(again.x, first.x)
    assert [p.name for p in (tmp_path / "reference").iterdir()] == [
        p.name for p in (tmp_path / "reference").glob("logreg-*.npz")
    ]


@pytest.mark.parametrize(
    "kind",
    list(_corruptions(b"0123456789" * 10, np.zeros(5), 0.0)),
)
def test_damaged_entry_is_recomputed(solve, exact, tmp_path, kind):
    first = solve()
    (path,) = (tmp_path / "reference").glob("*.npz")
    good = path.read_bytes()
    path.write_bytes(_corruptions(good, first.x, first.fun)[kind])
    redo = solve()
    x_exact, f_exact = exact
    assert redo.nit > 0 and redo.converged
    assert np.all(np.isfinite(redo.x))
    assert redo.fun == pytest.approx(f_exact, abs=1e-13)
    np.testing.assert_allclose(redo.x, x_exact, atol=1e-7)
    # The entry was rewritten and is used again.
    assert solve().nit == 0


def test_entry_for_a_coarser_tolerance_is_not_used(solve, tmp_path, monkeypatch):
    X, y = _data()
    monkeypatch.setattr(_reference, "_MEMORY", {})
    coarse = LogisticRegression(X, y, l2=L2).reference_solution(gtol=1e-3, cache_dir=tmp_path)
    assert coarse.grad_norm <= 1e-3
    fine = solve()
    assert fine.nit > 0 and fine.grad_norm <= 1e-10


def test_interrupted_write_leaves_the_old_entry_and_no_stray_files(solve, tmp_path, monkeypatch):
    first = solve()
    (path,) = (tmp_path / "reference").glob("*.npz")
    good = path.read_bytes()
    real_savez = np.savez

    def disk_full(file, **fields):
        buf = io.BytesIO()
        real_savez(buf, **fields)
        data = buf.getvalue()
        if isinstance(file, str | bytes) or hasattr(file, "__fspath__"):
            with open(file, "wb") as fh:
                fh.write(data[:100])
        else:
            file.write(data[:100])
        raise OSError(errno.ENOSPC, "No space left on device")

    path.write_bytes(b"damaged")  # forces a solve and a write
    monkeypatch.setattr(np, "savez", disk_full)
    redo = solve()
    monkeypatch.setattr(np, "savez", real_savez)
    assert redo.nit > 0 and redo.fun == pytest.approx(first.fun, abs=1e-13)
    assert path.read_bytes() == b"damaged"  # never a half-written entry in its place
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    # Once writing works again the entry is repaired.
    assert solve().nit > 0
    assert path.read_bytes() != b"damaged" and solve().nit == 0
    assert good  # the original entry was a real file


def test_writes_go_through_a_temporary_file(solve, tmp_path, monkeypatch):
    calls = []
    real_replace = _reference.os.replace

    def spy(src, dst):
        calls.append((str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(_reference.os, "replace", spy)
    solve()
    (path,) = (tmp_path / "reference").glob("*.npz")
    assert len(calls) == 1
    src, dst = calls[0]
    assert dst == str(path) and src != dst and src.startswith(str(path.parent))


def test_unwritable_cache_directory_is_not_an_error(tmp_path, monkeypatch):
    X, y = _data()
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setattr(_reference, "_MEMORY", {})
    sol = LogisticRegression(X, y, l2=L2).reference_solution(cache_dir=blocker)
    assert sol.converged
