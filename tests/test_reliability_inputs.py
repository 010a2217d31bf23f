"""Input families a careless or hostile user meets, across the public entry points.

* Files read together that would disagree silently: a LIBSVM train/test pair whose
  index base, width or labels would be decided file by file is read with one
  decision for all (``load_libsvm_files``, as scikit-learn's ``load_svmlight_files``).
* Integrity where no hash was recorded: a registered data set whose copy holds fewer
  samples than the registry says is refused (``fetch_libsvm``, ``load_libsvm``,
  ``LogisticRegression.from_libsvm``), or replaced by a verified download.
* Degenerate forms of ``x0`` that scipy accepts: a list or tuple of NumPy scalars is a
  vector (``amopt.minimize``, full batch and mini-batch, and ``scipy_method``).
* Options accepted and then ignored: ``tol`` given to ``scipy.optimize.minimize`` with
  ``scipy_method`` is ``gtol``, as in ``amopt.minimize``; ``hess`` is reported unused.
"""

from __future__ import annotations

import bz2
import hashlib
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.optimize

import amopt
import amopt.datasets as ds
from amopt.datasets import ChecksumError, dataset_info, fetch_libsvm, load_libsvm
from amopt.problems import LogisticRegression

from _objectives import DIAG_A, DIAG_B, DIAG_X_STAR, Logistic, diag_f, diag_g, logreg_data

pytest.importorskip("sklearn")

# --------------------------------------------------------------------------- LIBSVM pairs


def _write_libsvm(path: Path, X: np.ndarray, y: np.ndarray, base: int) -> None:
    """Dense ``X`` as a LIBSVM file with indices starting at ``base`` (zeros left out)."""
    lines = []
    for row, label in zip(X, y, strict=True):
        feats = " ".join(f"{j + base}:{float(v)!r}" for j, v in enumerate(row) if v != 0)
        lines.append(f"{label:g} {feats}".rstrip())
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def zero_based_pair(tmp_path):
    """A zero-based train file that uses column 0 and a test file that does not."""
    rng = np.random.default_rng(0)
    X_train = np.round(rng.uniform(-1, 1, (8, 5)), 3)
    X_test = np.round(rng.uniform(-1, 1, (4, 5)), 3)
    X_test[:, 0] = 0.0  # the test split never uses feature 0
    X_test[:, 4] = 0.0  # nor the last one
    y_train = np.array([1, 2, 3, 1, 2, 3, 1, 2], dtype=float)
    y_test = np.array([3, 3, 2, 3], dtype=float)  # class 1 absent from the test split
    train, test = tmp_path / "train.txt", tmp_path / "test.txt"
    _write_libsvm(train, X_train, y_train, base=0)
    _write_libsvm(test, X_test, y_test, base=0)
    return train, test, (X_train, y_train, X_test, y_test)


def test_pair_is_read_with_one_index_base(zero_based_pair):
    train, test, (X_train, _, X_test, _) = zero_based_pair
    # read file by file, "auto" decides each base alone: the test split's columns shift
    shifted = load_libsvm(test, n_features=5)[0].toarray()
    assert not np.array_equal(shifted, X_test)
    for n_features in (5, None):
        Xa, _, Xb, _ = ds.load_libsvm_files([train, test], n_features=n_features)
        np.testing.assert_array_equal(Xa.toarray(), X_train)
        np.testing.assert_array_equal(Xb.toarray(), X_test)  # width 5 from train's columns
    # an explicit base is honoured for both
    Xa, _, Xb, _ = ds.load_libsvm_files([train, test], zero_based=True)
    np.testing.assert_array_equal(Xb.toarray(), X_test)


def test_pair_labels_are_mapped_with_one_decision(zero_based_pair, tmp_path):
    train, test, (_, y_train, _, y_test) = zero_based_pair
    _, ia, _, ib = ds.load_libsvm_files([train, test], labels="index")
    np.testing.assert_array_equal(ia, y_train.astype(int) - 1)
    np.testing.assert_array_equal(ib, y_test.astype(int) - 1)  # 3 stays class 2, not 1
    assert ib.dtype == np.int64

    # binary {1, 2} train, a test split holding only 1: both map 1 to -1
    X = np.eye(3)
    _write_libsvm(tmp_path / "b_train", X, np.array([1.0, 2.0, 2.0]), base=1)
    _write_libsvm(tmp_path / "b_test", X, np.array([1.0, 1.0, 1.0]), base=1)
    assert load_libsvm(tmp_path / "b_test", labels="binary")[1].tolist() == [1.0] * 3
    _, ya, _, yb = ds.load_libsvm_files(
        [tmp_path / "b_train", tmp_path / "b_test"], labels="binary"
    )
    assert ya.tolist() == [-1.0, 1.0, 1.0] and yb.tolist() == [-1.0] * 3
    # more than two labels over the files: binary labels cannot be decided
    _write_libsvm(tmp_path / "c_test", X, np.array([3.0, 3.0, 3.0]), base=1)
    with pytest.raises(ValueError, match="at most 2 distinct values over the files"):
        ds.load_libsvm_files([tmp_path / "b_train", tmp_path / "c_test"], labels="binary")


def test_pair_of_registry_names_and_bad_arguments(tmp_path):
    a1a = dataset_info("a1a")
    X1, y1, X2, y2 = ds.load_libsvm_files(["a1a", "mushrooms"])
    assert X1.shape == (a1a.n_samples, 123) and X2.shape == (8124, 123)  # one width
    X, y = load_libsvm("a1a")
    assert (X1 != X).nnz == 0 and np.array_equal(y1, y)
    with pytest.raises(TypeError, match="list or tuple of paths"):
        ds.load_libsvm_files("a1a")
    with pytest.raises(ValueError, match="at least one file"):
        ds.load_libsvm_files([])
    bad = tmp_path / "bad.txt"
    bad.write_text("1 1:0.5\n2 2:x\n")
    good = tmp_path / "good.txt"
    good.write_text("1 1:0.5\n")
    with pytest.raises(ValueError, match=rf"{bad}: line 2: .*'2:x'"):
        ds.load_libsvm_files([good, bad])


SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "libsvm"


@pytest.mark.skipif(not (SHARED / "a9a.t").is_file(), reason=f"{SHARED} is absent")
def test_real_train_test_pair_as_the_registry_reads_each():
    """a9a / a9a.t (one-based; the test split does not use every feature) read together
    give what each gives with the registry's width and base."""
    Xa, ya, Xt, yt = ds.load_libsvm_files([SHARED / "a9a", SHARED / "a9a.t"], labels="binary")
    for X, y, name in ((Xa, ya, "a9a"), (Xt, yt, "a9a.t")):
        info = dataset_info(name)
        ref_X, ref_y = load_libsvm(SHARED / name, n_features=123, zero_based=False)
        assert X.shape == (info.n_samples, info.n_features)
        assert (X != ref_X).nnz == 0 and np.array_equal(y, np.where(ref_y > 0, 1.0, -1.0))


# --------------------------------------------------------------------------- integrity

NO_HASH = "heart"  # registered, no SHA-256 in the registry


def _rows(n: int, n_features: int = 13) -> bytes:
    lines = [
        f"{1 if i % 3 else -1} " + " ".join(f"{j}:{(i * j) % 7 - 3}" for j in range(1, n_features))
        for i in range(n)
    ]
    return ("\n".join(lines) + "\n").encode()


def _mirror(tmp_path: Path, name: str, data: bytes) -> str:
    """A LIBSVM-layout folder served as a ``file://`` mirror."""
    root = tmp_path / "mirror"
    target = root / dataset_info(name).path
    target.parent.mkdir(parents=True)
    target.write_bytes(data)
    return root.as_uri() + "/"


def test_truncated_copy_without_any_hash_is_refused(tmp_path):
    info = dataset_info(NO_HASH)
    assert info.sha256 is None
    cached = tmp_path / "libsvm" / info.file_name
    cached.parent.mkdir()
    cached.write_bytes(_rows(info.n_samples)[:2000].rsplit(b"\n", 1)[0] + b"\n")  # whole lines
    n = len(cached.read_bytes().splitlines())
    assert 0 < n < info.n_samples
    expected = rf"holds {n} samples, but the registry says '{NO_HASH}' has {info.n_samples}"
    with pytest.raises(ChecksumError, match=expected):
        fetch_libsvm(NO_HASH, cache_dir=tmp_path, download=False)
    with pytest.raises(ChecksumError, match=expected):
        load_libsvm(NO_HASH, cache_dir=tmp_path, download=False)
    with pytest.raises(ChecksumError, match=expected):
        LogisticRegression.from_libsvm(NO_HASH, cache_dir=tmp_path, download=False)
    assert not (cached.parent / (cached.name + ".sha256")).exists()  # nothing recorded
    # verify=False uses it as it is
    X, _ = load_libsvm(NO_HASH, cache_dir=tmp_path, download=False, verify=False)
    assert X.shape == (n, info.n_features)


def test_a_compressed_copy_cut_short_is_refused(tmp_path):
    info = dataset_info("ijcnn1")  # a .bz2 file, no registered hash
    assert info.sha256 is None and info.file_name.endswith(".bz2")
    cached = tmp_path / "libsvm" / info.file_name
    cached.parent.mkdir()
    whole = bz2.compress(_rows(info.n_samples, info.n_features))
    cached.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ChecksumError, match="cannot be read to its end"):
        fetch_libsvm("ijcnn1", cache_dir=tmp_path, download=False)


def test_whole_copy_placed_by_hand_is_accepted_and_recorded(tmp_path):
    info = dataset_info(NO_HASH)
    data = _rows(info.n_samples)
    cached = tmp_path / "libsvm" / info.file_name
    cached.parent.mkdir()
    cached.write_bytes(data)
    assert fetch_libsvm(NO_HASH, cache_dir=tmp_path, download=False) == cached
    sidecar = cached.with_name(cached.name + ".sha256")
    assert sidecar.read_text().split()[0] == hashlib.sha256(data).hexdigest()
    X, y = load_libsvm(NO_HASH, cache_dir=tmp_path, download=False)
    assert X.shape == (info.n_samples, info.n_features) and y.shape == (info.n_samples,)
    # from now on the recorded hash guards it: a later truncation is a hash mismatch
    cached.write_bytes(data[:-50])
    with pytest.raises(ChecksumError, match="has sha256"):
        fetch_libsvm(NO_HASH, cache_dir=tmp_path, download=False)


def test_truncated_copy_is_replaced_by_a_download_that_holds_every_sample(tmp_path):
    info = dataset_info(NO_HASH)
    data = _rows(info.n_samples)
    base_url = _mirror(tmp_path, NO_HASH, data)
    cache = tmp_path / "cache"
    cached = cache / "libsvm" / info.file_name
    cached.parent.mkdir(parents=True)
    cached.write_bytes(data[:1000].rsplit(b"\n", 1)[0] + b"\n")
    with pytest.warns(UserWarning, match="truncated or corrupted"):
        X, _ = load_libsvm(NO_HASH, cache_dir=cache, base_url=base_url)
    assert X.shape[0] == info.n_samples and cached.read_bytes() == data
    assert cached.with_name(cached.name + ".sha256").is_file()


def test_a_download_short_of_samples_is_deleted_not_recorded(tmp_path):
    info = dataset_info(NO_HASH)
    base_url = _mirror(tmp_path, NO_HASH, _rows(info.n_samples - 7))
    cache = tmp_path / "cache"
    with pytest.raises(ChecksumError, match=rf"holds {info.n_samples - 7} samples"):
        fetch_libsvm(NO_HASH, cache_dir=cache, base_url=base_url)
    assert not (cache / "libsvm" / info.file_name).exists()
    assert not (cache / "libsvm" / (info.file_name + ".sha256")).exists()


# --------------------------------------------------------------------------- x0

SCALAR_LISTS = [
    [np.float64(0.5), np.float64(-1.0), np.float64(2.0)],
    (np.float64(0.5), np.float64(-1.0), np.float64(2.0)),
    [np.float32(0.5), np.float32(-1.0), np.float32(2.0)],
    [np.int64(1), np.int64(-1), np.int64(2)],
    [np.float64(0.5), -1.0, 2],  # mixed with Python numbers
]


@pytest.mark.parametrize(
    "x0", SCALAR_LISTS, ids=lambda x: f"{type(x).__name__}-{type(x[0]).__name__}"
)
@pytest.mark.parametrize("method", ["am-mgd", "adam"])
def test_a_list_of_numpy_scalars_is_a_vector(x0, method):
    """The run equals the one from ``np.asarray(x0)``; the result is its shape and dtype."""
    ref_x0 = np.asarray(x0)
    opts = {"lr": 0.05, "maxiter": 300, "gtol": 1e-6}
    ref = amopt.minimize(diag_f, ref_x0, jac=diag_g, method=method, options=opts)
    res = amopt.minimize(diag_f, x0, jac=diag_g, method=method, options=opts)
    assert isinstance(res.x, np.ndarray) and res.x.shape == (3,)
    assert res.x.dtype == ref.x.dtype and res.nit == ref.nit
    np.testing.assert_array_equal(res.x, ref.x)
    # and through scipy with amopt's method
    sres = scipy.optimize.minimize(
        diag_f, x0, jac=diag_g, method=amopt.scipy_method(method), options=opts
    )
    np.testing.assert_allclose(
        sres.x, ref.x, rtol=0, atol=1e-12 if ref.x.dtype == np.float64 else 1e-6
    )
    if res.success:
        tol = 1e-4 if ref.x.dtype == np.float64 else 1e-3
        np.testing.assert_allclose(res.x, DIAG_X_STAR, atol=tol)


def test_a_list_of_numpy_scalars_for_a_finite_sum():
    X, y = logreg_data()
    prob = Logistic(np, X, y)
    x0 = [np.float32(0.0)] * X.shape[1]  # not Python floats, as np.float64 would be
    opts = {"lr": 0.1, "maxiter": 20, "batch_size": 8, "seed": 3}
    ref_x0 = np.zeros(X.shape[1], dtype=np.float32)
    ref = amopt.minimize(prob, ref_x0, method="am-sgd", options=opts)
    res = amopt.minimize(prob, x0, method="am-sgd", options=opts)
    assert res.x.dtype == np.float32 and res.x.shape == ref_x0.shape
    np.testing.assert_array_equal(res.x, ref.x)
    np.testing.assert_array_equal(res.betas, ref.betas)


def test_a_list_of_0d_arrays_is_still_a_parameter_list():
    """0-d arrays (not NumPy scalars) keep their documented meaning: one array each."""
    x0 = [np.array(0.5), np.array(-1.0)]
    A = DIAG_A[:2, :2]
    b = DIAG_B[:2]

    def f(xs):
        x = np.array([float(xs[0]), float(xs[1])])
        return 0.5 * x @ A @ x - b @ x

    def g(xs):
        x = np.array([float(xs[0]), float(xs[1])])
        gx = A @ x - b
        return [np.array(gx[0]), np.array(gx[1])]

    res = amopt.minimize(f, x0, jac=g, options={"lr": 0.05, "per_layer": True, "maxiter": 5})
    assert isinstance(res.x, list) and [a.shape for a in res.x] == [(), ()]
    assert res.betas.shape == (res.nit, 2)  # one beta per array


# --------------------------------------------------------------------------- tol


@pytest.mark.parametrize(
    ("method", "extra"), [("am-mgd", {"numerator": "linear"}), ("gd", {}), ("am-adam", {})]
)
def test_scipy_tol_is_gtol(method, extra):
    x0 = np.array([1.0, -2.0, 3.0])
    runs = {}
    for tol in (1e-2, 1e-7):
        res = scipy.optimize.minimize(
            diag_f, x0, jac=diag_g, method=amopt.scipy_method(method), tol=tol,
            options={"lr": 0.09, "maxiter": 5000, **extra},
        )  # fmt: skip
        ref = amopt.minimize(
            diag_f,
            x0,
            jac=diag_g,
            method=method,
            options={"lr": 0.09, "maxiter": 5000, "gtol": tol, **extra},
        )
        assert res.success and res.nit == ref.nit
        np.testing.assert_array_equal(res.x, ref.x)
        assert np.max(np.abs(diag_g(res.x))) <= tol  # the stop it asked for
        runs[tol] = res.nit
    assert runs[1e-7] > runs[1e-2]
    # a gtol in options wins, as in amopt.minimize
    res = scipy.optimize.minimize(
        diag_f, x0, jac=diag_g, method=amopt.scipy_method(method), tol=1e-2,
        options={"lr": 0.09, "maxiter": 5000, "gtol": 1e-7, **extra},
    )  # fmt: skip
    assert res.nit == runs[1e-7]


def test_tol_is_checked_by_name_and_scipys_unknown_option_warning_is_gone():
    x0 = np.ones(3)
    with pytest.raises(ValueError, match="tol must be a finite number >= 0; got tol=-1"):
        amopt.minimize(diag_f, x0, jac=diag_g, tol=-1)
    with pytest.raises(ValueError, match="tol must be a finite number >= 0; got tol=-1"):
        scipy.optimize.minimize(diag_f, x0, jac=diag_g, method=amopt.scipy_method("gd"), tol=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no OptimizeWarning about an unknown "tol"
        scipy.optimize.minimize(
            diag_f, x0, jac=diag_g, method=amopt.scipy_method("am-mgd"), tol=1e-3,
            options={"lr": 0.1},
        )  # fmt: skip


def test_hessian_given_to_a_first_order_method_is_reported():
    x0 = np.ones(3)
    with pytest.warns(
        RuntimeWarning, match=r"Method am-mgd does not use Hessian information \(hess\)"
    ):
        scipy.optimize.minimize(
            diag_f, x0, jac=diag_g, hess=lambda x: DIAG_A, method=amopt.scipy_method("am-mgd"),
            options={"lr": 0.1},
        )  # fmt: skip
    with pytest.warns(RuntimeWarning, match=r"\(hessp\)"):
        scipy.optimize.minimize(
            diag_f, x0, jac=diag_g, hessp=lambda x, p: DIAG_A @ p,
            method=amopt.scipy_method("gd"), options={"lr": 0.1},
        )  # fmt: skip


def test_truncated_copy_in_the_experiments_data_folder_is_refused(tmp_path):
    """The experiments read <data>/libsvm/mushrooms (the cache's own file) as a path: a
    copy that lost its last rows is refused there too."""
    from amopt.experiments._data import load_logreg_problem

    X, y = load_libsvm("mushrooms")
    folder = tmp_path / "libsvm"
    folder.mkdir()
    rows = []
    for i in range(X.shape[0] - 100):
        row = X.getrow(i)
        feats = " ".join(f"{j + 1}:{v:g}" for j, v in zip(row.indices, row.data, strict=True))
        rows.append(f"{y[i]:g} {feats}")
    (folder / "mushrooms").write_text("\n".join(rows) + "\n")
    with pytest.raises(ChecksumError, match=r"holds 8024 samples, but mushrooms has 8124"):
        load_logreg_problem("mushrooms", tmp_path)
