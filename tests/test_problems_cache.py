"""The on-disk cache of reference solutions (x*, f*): damaged, stale or foreign entries are
recomputed, never trusted and never a crash; entries are written atomically."""

from __future__ import annotations

import errno
import io
import logging
import platform
from pathlib import Path

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


# --------------------------------------------------------------------------- where, and said


def _tree(root):
    """Every path under ``root`` with its size and modification time (a write changes it)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    } | {".": root.stat().st_mtime_ns}


def _write_libsvm(path, X, y):
    lines = [
        " ".join([f"{int(t):+d}"] + [f"{j + 1}:{v:.17g}" for j, v in enumerate(row)])
        for row, t in zip(X, y, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def data_folder(tmp_path, monkeypatch):
    """A data folder (``AMOPT_DATA_DIR``) holding one LIBSVM file, read-only; an empty
    cache directory (``AMOPT_CACHE_DIR``); an empty in-memory cache."""
    pytest.importorskip("sklearn")
    data = tmp_path / "data"
    (data / "libsvm").mkdir(parents=True)
    X, y = _data()
    _write_libsvm(data / "libsvm" / "mine", X, y)
    for p in (data / "libsvm", data):
        p.chmod(0o555)
    cache = tmp_path / "cache"
    monkeypatch.setenv("AMOPT_DATA_DIR", str(data))
    monkeypatch.setenv("AMOPT_CACHE_DIR", str(cache))
    monkeypatch.setattr(_reference, "_MEMORY", {})
    yield data, cache
    for p in (data, data / "libsvm"):
        p.chmod(0o755)


def test_reference_is_cached_in_the_cache_dir_never_in_the_data_folder(data_folder, exact):
    data, cache = data_folder
    before = _tree(data)
    prob = LogisticRegression.from_libsvm(data / "libsvm" / "mine", l2=L2)
    f_star = prob.f_star
    assert f_star == pytest.approx(exact[1], abs=1e-13)  # the file holds the same data
    assert _tree(data) == before  # nothing written, created or touched in the data folder
    (entry,) = (cache / "reference").glob("logreg-*.npz")
    with np.load(entry) as z:
        np.testing.assert_allclose(z["x"], exact[0], atol=1e-7)


def test_default_cache_dir_is_the_platform_user_cache_dir(tmp_path, monkeypatch):
    X, y = _data()
    monkeypatch.delenv("AMOPT_CACHE_DIR", raising=False)
    monkeypatch.setenv("AMOPT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(_reference, "_MEMORY", {})
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    LogisticRegression(X, y, l2=L2).reference_solution()
    assert len(list((tmp_path / "xdg" / "amopt" / "reference").glob("logreg-*.npz"))) == 1
    assert not (tmp_path / "data").exists() and not (tmp_path / "home").exists()


def test_user_cache_dir_matches_platformdirs(tmp_path, monkeypatch):
    pytest.importorskip("platformdirs")
    from platformdirs.macos import MacOS
    from platformdirs.unix import Unix

    from amopt.datasets import _download, get_cache_home

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _download.user_cache_dir("Linux") == Path(Unix("amopt").user_cache_dir)
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert str(_download.user_cache_dir("Linux")) == Unix("amopt").user_cache_dir
    assert str(_download.user_cache_dir("Darwin")) == MacOS("amopt").user_cache_dir
    # Windows: CSIDL_LOCAL_APPDATA is %LOCALAPPDATA%; platformdirs appends <app>\Cache
    local = str(tmp_path / "Local")
    got = _download.user_cache_dir("Windows", {"LOCALAPPDATA": local})
    assert got == Path(local, "amopt", "Cache")
    # AMOPT_CACHE_DIR wins over the platform's directory, cache_dir= over both
    monkeypatch.setenv("AMOPT_CACHE_DIR", str(tmp_path / "mine"))
    assert get_cache_home() == tmp_path / "mine"
    assert get_cache_home(tmp_path / "arg") == tmp_path / "arg"


def test_a_long_solve_says_what_it_computes_and_where_it_is_cached(tmp_path, monkeypatch, capsys):
    X, y = _data()
    monkeypatch.setattr(_reference, "_MEMORY", {})
    monkeypatch.setattr(_reference, "NOTICE_AFTER_S", 0.0)  # every solve counts as long
    sol = LogisticRegression(X, y, l2=L2).reference_solution(cache_dir=tmp_path)
    err = capsys.readouterr().err
    (entry,) = (tmp_path / "reference").glob("logreg-*.npz")
    lines = [line for line in err.splitlines() if line.startswith("amopt:")]
    assert len(lines) == 1, err  # one line, not one per iteration
    assert "reference solution (x*, f*)" in lines[0] and str(entry) in lines[0]
    assert sol.nit > 0
    # A cached answer (no solve) and a quick solve print nothing.
    monkeypatch.setattr(_reference, "_MEMORY", {})
    LogisticRegression(X, y, l2=L2).reference_solution(cache_dir=tmp_path)
    monkeypatch.setattr(_reference, "NOTICE_AFTER_S", 60.0)
    LogisticRegression(X, y, l2=2 * L2).reference_solution(cache_dir=tmp_path)
    assert "amopt:" not in capsys.readouterr().err
    # The notice can be silenced as any logger.
    monkeypatch.setattr(_reference, "NOTICE_AFTER_S", 0.0)
    logging.getLogger("amopt.cache").setLevel(logging.WARNING)
    try:
        LogisticRegression(X, y, l2=3 * L2).reference_solution(cache_dir=tmp_path)
    finally:
        logging.getLogger("amopt.cache").setLevel(logging.INFO)
    assert "amopt:" not in capsys.readouterr().err


def test_experiments_route_the_notice_through_their_log(tmp_path, monkeypatch, capsys):
    pytest.importorskip("tqdm")
    from amopt.experiments import RunContext

    X, y = _data()
    monkeypatch.setattr(_reference, "_MEMORY", {})
    monkeypatch.setattr(_reference, "NOTICE_AFTER_S", 0.0)
    logged: list[str] = []
    ctx = RunContext(out=tmp_path)
    monkeypatch.setattr(ctx, "log", logged.append)
    with ctx.cache_notices():
        LogisticRegression(X, y, l2=L2).reference_solution(cache_dir=tmp_path)
    assert len(logged) == 1 and logged[0].startswith("amopt: computing the reference solution")
    assert capsys.readouterr().err == ""  # once, through the log, not also on stderr
    # --quiet: nothing at all; outside the block the logger prints to stderr again
    monkeypatch.setattr(_reference, "_MEMORY", {})
    with RunContext(out=tmp_path, quiet=True).cache_notices():
        LogisticRegression(X, y, l2=2 * L2).reference_solution(cache_dir=tmp_path)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(_reference, "_MEMORY", {})
    LogisticRegression(X, y, l2=3 * L2).reference_solution(cache_dir=tmp_path)
    assert "amopt: computing" in capsys.readouterr().err
