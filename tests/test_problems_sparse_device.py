"""Problems built on a SciPy sparse matrix, evaluated on torch sparse CSR and CuPy sparse.

Every value and gradient is compared with the SciPy evaluation of the same
problem at the same point: float64 to 1e-10, lower precisions to a bound
derived from the dtype's unit roundoff and the magnitudes summed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import amopt
from amopt.backends import library_available, to_numpy
from amopt.problems import (
    HuberRegression,
    LeastSquares,
    LogisticRegression,
    NonconvexLogisticRegression,
    _base,
)

torch = pytest.importorskip("torch")

from benchmarks.counters import HostReads  # noqa: E402

_ROOT = Path(__file__).resolve().parents[1]
# the shared data sets: next to the checkout, or beside the folder of checkouts
_SHARED = [p / "shared" / "data" / "libsvm" for p in (_ROOT, _ROOT.parent, _ROOT.parent.parent)]

# ----------------------------------------------------------------------------- devices


def _devices() -> list:
    """(id, to_device(numpy array, dtype name) -> array) for every sparse device backend here."""
    out = [("torch-cpu", lambda a, dt="float64": torch.as_tensor(a, dtype=getattr(torch, dt)))]
    if torch.cuda.is_available():
        out.append(
            (
                "torch-cuda",
                lambda a, dt="float64": torch.as_tensor(
                    a, dtype=getattr(torch, dt), device="cuda"
                ),
            )
        )
    if library_available("cupy"):
        import cupy

        out.append(("cupy", lambda a, dt="float64": cupy.asarray(np.asarray(a).astype(dt))))
    return out


DEVICES = _devices()
DEVICE_IDS = [d[0] for d in DEVICES]


@pytest.fixture(params=DEVICES, ids=DEVICE_IDS)
def dev(request):
    return request.param[1]


# ----------------------------------------------------------------------------- problems


def _matrix(seed: int = 0, n: int = 120, d: int = 15) -> sp.csr_matrix:
    """A sparse design with an empty row, a full (longest) row, and rows of varied length."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, d)) * (rng.random((n, d)) < 0.25)
    A[5] = 0.0
    A[n - 1] = 0.0  # an empty last row: its start is nnz
    A[7] = rng.standard_normal(d)
    return sp.csr_matrix(A)


def _uniform_matrix(seed: int = 3, n: int = 120, d: int = 15, k: int = 3) -> sp.csr_matrix:
    """``k`` entries in every row but the last two (empty): stored as a padded block."""
    rng = np.random.default_rng(seed)
    cols = np.array([rng.choice(d, k, replace=False) for _ in range(n - 2)])
    A = sp.csr_matrix(
        (
            rng.standard_normal(cols.size),
            cols.ravel(),
            np.r_[np.arange(0, cols.size + 1, k), [cols.size] * 2],
        ),
        shape=(n, d),
    )
    A.sort_indices()
    return A


def _problems() -> dict:
    X = _matrix()
    U = _uniform_matrix()
    rng = np.random.default_rng(1)
    n = X.shape[0]
    y2 = np.where(rng.random(n) < 0.5, 1, 2)
    y3 = rng.integers(0, 3, n) * 10
    yr = rng.standard_normal(n)
    return {
        "logreg-binary-l2": LogisticRegression(X, y2, l2=0.05),
        "logreg-softmax": LogisticRegression(X, y3),
        "logreg-softmax-l2": LogisticRegression(X, y3, l2=0.1),
        "least-squares": LeastSquares(X, yr),
        "least-squares-l2": LeastSquares(X, yr, l2=0.3),
        "huber": HuberRegression(X, 3.0 * yr, delta=0.5),
        "nonconvex-logreg": NonconvexLogisticRegression(X, y2, alpha=0.2),
        "padded-logreg-binary": LogisticRegression(U, y2, l2=0.01),
        "padded-logreg-softmax": LogisticRegression(U, y3),
        "padded-least-squares": LeastSquares(U, yr),
    }


PROBLEMS = _problems()


@pytest.fixture(params=list(PROBLEMS), ids=list(PROBLEMS))
def prob(request):
    return PROBLEMS[request.param]


def _point(prob, seed: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(prob.dim)


def _assert_close64(got, want, what: str) -> None:
    got = np.asarray(to_numpy(got), dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, what
    err = float(np.max(np.abs(got - want)))
    assert err <= 1e-10 * max(1.0, float(np.max(np.abs(want)))), f"{what}: error {err:.3e}"


def _magnitudes(prob, x: np.ndarray, idx=None) -> tuple[float, np.ndarray]:
    """Sums of magnitudes a low-precision evaluation rounds: for ``f`` and per gradient entry.

    With :math:`s_i = \\sum_j |a_{ij}| \\max|x| + \\max|t| + 1` (a bound on the
    magnitudes entering row i's residual, margin or scores and on the loss
    derivative's size), the rounding error of ``f`` is at most a small multiple of
    :math:`u\\,\\mathrm{mean}(s)` and that of gradient entry ``j`` of
    :math:`u\\,(|X|^\\top s)_j / m` (plus the regulariser's terms).
    """
    H = abs(prob._data.host)
    t = np.abs(prob._data.targets)
    if idx is not None:
        H, t = H[idx], t[idx]
    m = H.shape[0]
    xm = float(np.max(np.abs(x)))
    s = np.asarray(H.sum(axis=1)).ravel() * xm + float(np.max(t)) + 1.0
    reg = getattr(prob, "l2", 0.0) + 2.0 * getattr(prob, "alpha", 0.0)
    f_mag = float(np.mean(s)) * (1.0 + float(np.max(t))) + reg * float(np.sum(x * x))
    g_mag = np.asarray(H.T @ s).ravel() / m * (1.0 + float(np.max(t))) + reg * xm
    return f_mag, g_mag


def _assert_close_lowp(prob, got_f, got_g, x64, idx, eps: float) -> None:
    """Low-precision ``(got_f, got_g)`` against the float64 SciPy evaluation at the same point."""
    if idx is None:
        f, g = prob.value_and_grad(x64)
    else:
        f, g = prob.batch_value_and_grad(x64, idx)
    f_mag, g_mag = _magnitudes(prob, x64, idx)
    kmax = int(np.max(np.diff(prob._data.host.indptr)))
    # products accumulate <= kmax terms per row, reductions over <= n rows (pairwise or
    # blocked: log2 n), elementwise functions a few ulps each
    c = (kmax + math.log2(prob.n_samples) + 16) * eps
    gf = float(to_numpy(got_f))
    assert abs(gf - float(f)) <= c * f_mag, (gf, float(f), c * f_mag)
    gg = np.asarray(to_numpy(got_g), dtype=np.float64).reshape(prob._data.d, -1)
    err = np.abs(gg - np.asarray(g).reshape(prob._data.d, -1))
    assert np.all(err <= c * g_mag[:, None]), float(np.max(err / (c * g_mag[:, None])))


# ----------------------------------------------------------------------------- full evaluation


def test_full_evaluation_float64_matches_scipy(prob, dev):
    x = _point(prob)
    f, g = prob.value_and_grad(x)
    xd = dev(x)
    fd, gd = prob.value_and_grad(xd)
    assert type(gd) is type(xd) and gd.dtype == xd.dtype and tuple(gd.shape) == (prob.dim,)
    assert str(getattr(gd, "device", "")) == str(getattr(xd, "device", ""))
    _assert_close64(fd, f, "value")
    _assert_close64(gd, g, "gradient")
    _assert_close64(prob.fun(xd), f, "fun")
    _assert_close64(prob.grad(xd), g, "grad")


def test_softmax_accepts_matrix_shaped_parameters(dev):
    prob = PROBLEMS["logreg-softmax-l2"]
    W = _point(prob).reshape(prob.n_features, prob.n_classes)
    f, g = prob.value_and_grad(W)
    fd, gd = prob.value_and_grad(dev(W))
    assert tuple(gd.shape) == W.shape
    _assert_close64(fd, f, "value")
    _assert_close64(gd, g, "gradient")


def test_full_evaluation_float32_within_rounding_bound(prob, dev):
    x32 = _point(prob).astype(np.float32)
    fd, gd = prob.value_and_grad(dev(x32, "float32"))
    assert str(gd.dtype).endswith("float32")
    _assert_close_lowp(prob, fd, gd, x32.astype(np.float64), None, float(np.finfo(np.float32).eps))


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_half_precision_torch_evaluates_in_float32_and_answers_in_its_dtype(dt):
    prob = PROBLEMS["logreg-binary-l2"]
    xt = torch.as_tensor(_point(prob) * 0.1, dtype=getattr(torch, dt))
    fd, gd = prob.value_and_grad(xt)
    assert gd.dtype == xt.dtype and fd.dtype == xt.dtype
    x64 = xt.double().numpy()
    eps = float(torch.finfo(xt.dtype).eps)
    _assert_close_lowp(prob, fd.double(), gd.double(), x64, None, eps)


# ----------------------------------------------------------------------------- mini-batches

# 4 rows (gathered block) and 200 rows with repeats (m * k_max > nnz: through the full products)
BATCHES = {
    "small": np.array([7, 5, 119, 3]),
    "small-repeats": np.array([7, 7, 0, 119, 119]),
    "large": np.random.default_rng(3).integers(0, 120, 200),
}


@pytest.mark.parametrize("batch", list(BATCHES), ids=list(BATCHES))
@pytest.mark.parametrize("where", ["device-indices", "numpy-indices"])
def test_batch_evaluation_float64_matches_scipy(prob, dev, batch, where):
    idx = BATCHES[batch]
    x = _point(prob, 4)
    f, g = prob.batch_value_and_grad(x, idx)
    ix = dev(idx, "int64") if where == "device-indices" else idx
    fd, gd = prob.batch_value_and_grad(dev(x), ix)
    _assert_close64(fd, f, "batch value")
    _assert_close64(gd, g, "batch gradient")


def test_every_batch_strategy_is_exercised():
    data = PROBLEMS["least-squares"]._data
    kmax = int(np.max(np.diff(data.host.indptr)))
    assert kmax == data.d  # row 7 is full
    # rows of uneven length: small batches as a block built per batch, large ones through
    # the full products
    assert BATCHES["small"].size * kmax <= data.host.nnz < BATCHES["large"].size * kmax
    assert data.host.shape[0] * kmax > 2 * data.host.nnz
    # rows of equal length: the padded block is stored
    padded = PROBLEMS["padded-least-squares"]._data.host
    assert padded.shape[0] * 3 <= 2 * padded.nnz and np.max(np.diff(padded.indptr)) == 3
    assert BATCHES["small"].size * 3 <= padded.nnz
    for name, stored in (("padded-least-squares", True), ("least-squares", False)):
        prob = PROBLEMS[name]
        prob.value_and_grad(torch.zeros(prob.dim, dtype=torch.float64))
        assert [st.ell for st in prob._data._structures.values()] == [stored]


@pytest.mark.parametrize("batch", ["small", "large"])
def test_batch_evaluation_float32_within_rounding_bound(prob, dev, batch):
    idx = BATCHES[batch]
    x32 = _point(prob, 5).astype(np.float32)
    fd, gd = prob.batch_value_and_grad(dev(x32, "float32"), dev(idx, "int64"))
    eps = float(np.finfo(np.float32).eps)
    _assert_close_lowp(prob, fd, gd, x32.astype(np.float64), idx, eps)


def test_int32_and_uint8_torch_indices():
    prob = PROBLEMS["logreg-softmax"]
    x = _point(prob)
    idx = BATCHES["small-repeats"]
    f, g = prob.batch_value_and_grad(x, idx)
    for dt in (torch.int32, torch.uint8):
        fd, gd = prob.batch_value_and_grad(torch.as_tensor(x), torch.as_tensor(idx, dtype=dt))
        _assert_close64(fd, f, f"value ({dt})")
        _assert_close64(gd, g, f"gradient ({dt})")


# ----------------------------------------------------------------------------- structure


@pytest.mark.parametrize("batch", ["small", "large"])
def test_torch_evaluation_reads_nothing_back_to_the_host(prob, batch):
    xt = torch.as_tensor(_point(prob))
    it = torch.as_tensor(BATCHES[batch])
    prob.value_and_grad(xt)  # the device copy is built outside the count
    with HostReads() as c:
        prob.value_and_grad(xt)
        prob.batch_value_and_grad(xt, it)
    assert c.total_ops and c.syncs == 0, c.sync_sites


def test_device_copy_is_built_once_per_device_and_dtype(monkeypatch):
    built = {"matrix": 0, "structure": 0}

    class CountingCSR(_base.DeviceCSR):
        def __init__(self, *a, **k):
            built["matrix"] += 1
            super().__init__(*a, **k)

    class CountingStructure(_base._Structure):
        def __init__(self, *a, **k):
            built["structure"] += 1
            super().__init__(*a, **k)

    monkeypatch.setattr(_base, "DeviceCSR", CountingCSR)
    monkeypatch.setattr(_base, "_Structure", CountingStructure)
    prob = LeastSquares(_matrix(7), np.arange(120.0) / 120)
    x = _point(prob)
    for _ in range(3):
        for dt in (torch.float64, torch.float32):
            xt = torch.as_tensor(x, dtype=dt)
            prob.value_and_grad(xt)
            prob.batch_value_and_grad(xt, torch.as_tensor(BATCHES["small"]))
            prob.batch_value_and_grad(xt, BATCHES["large"])
    # one matrix per dtype, one set of index arrays shared by both
    assert built == {"matrix": 2, "structure": 1}


# ----------------------------------------------------------------------------- bad input


def test_other_namespaces_get_a_clear_type_error():
    xs = pytest.importorskip("array_api_strict")
    prob = PROBLEMS["least-squares"]
    with pytest.raises(TypeError, match="NumPy, torch and CuPy arrays.*X.toarray"):
        prob.value_and_grad(xs.asarray(_point(prob)))


@pytest.mark.parametrize(
    "indices, match",
    [
        (torch.tensor([[1, 2]]), "1-D integer array, got shape \\(1, 2\\)"),
        (torch.tensor([1.0, 2.0]), "1-D integer array.*float"),
        (torch.tensor([True, False]), "1-D integer array.*bool"),
        (torch.tensor([], dtype=torch.int64), "must not be empty"),
    ],
)
def test_bad_device_indices_are_rejected(indices, match):
    prob = PROBLEMS["logreg-binary-l2"]
    with pytest.raises(ValueError, match=match):
        prob.batch_value_and_grad(torch.as_tensor(_point(prob)), indices)


@pytest.mark.parametrize("bad", [120, -121])
def test_out_of_range_torch_indices_raise(bad):
    prob = PROBLEMS["logreg-binary-l2"]
    with pytest.raises(IndexError):
        prob.batch_value_and_grad(torch.as_tensor(_point(prob)), torch.tensor([0, bad]))


# ----------------------------------------------------------------------------- LIBSVM data


def test_bundled_libsvm_problem_on_the_device(dev):
    prob = LogisticRegression.from_libsvm("a1a", l2=1e-3)
    L = prob.L
    x = 0.1 * _point(prob, 6)
    f, g = prob.value_and_grad(x)
    fd, gd = prob.value_and_grad(dev(x))
    _assert_close64(fd, f, "value")
    _assert_close64(gd, g, "gradient")
    idx = np.random.default_rng(0).integers(0, prob.n_samples, 64)
    fb, gb = prob.batch_value_and_grad(x, idx)
    fbd, gbd = prob.batch_value_and_grad(dev(x), dev(idx, "int64"))
    _assert_close64(fbd, fb, "batch value")
    _assert_close64(gbd, gb, "batch gradient")
    assert prob.L == L


def test_f_star_of_a_libsvm_problem_is_the_device_value_at_x_star(dev):
    prob = LogisticRegression.from_libsvm("mushrooms", l2=1e-2)
    sol = prob.reference_solution(cache=False)
    fd, gd = prob.value_and_grad(dev(sol.x))
    _assert_close64(fd, prob.f_star, "f at x*")
    _assert_close64(gd, prob.grad(sol.x), "gradient at x*")
    assert float(np.max(np.abs(to_numpy(gd)))) <= 1e-10 + 1e-12  # the solve's gtol


@pytest.mark.parametrize("name", ["a9a", "letter.scale"])
def test_shared_libsvm_sets_on_the_device(name, dev):
    found = [p / name for p in _SHARED if (p / name).is_file()]
    if not found:
        pytest.skip(f"{name} not found in {', '.join(map(str, _SHARED))} (optional shared data)")
    path = found[0]
    prob = LogisticRegression.from_libsvm(path, l2=1e-4)
    x = 0.05 * _point(prob, 8)
    f, g = prob.value_and_grad(x)
    fd, gd = prob.value_and_grad(dev(x))
    _assert_close64(fd, f, "value")
    _assert_close64(gd, g, "gradient")
    for m in (256, 4096):
        idx = np.random.default_rng(m).integers(0, prob.n_samples, m)
        fb, gb = prob.batch_value_and_grad(x, idx)
        fbd, gbd = prob.batch_value_and_grad(dev(x), dev(idx, "int64"))
        _assert_close64(fbd, fb, f"batch {m} value")
        _assert_close64(gbd, gb, f"batch {m} gradient")


class _Recorded:
    """A finite sum that records the batches it is asked for (to replay them elsewhere)."""

    def __init__(self, prob, replay=None):
        self.prob, self.n_samples = prob, prob.n_samples
        self.batches: list[np.ndarray] = []
        self.replay = None if replay is None else iter(replay)

    def value_and_grad(self, x):
        return self.prob.value_and_grad(x)

    def batch_value_and_grad(self, x, indices):
        if self.replay is not None:
            indices = next(self.replay)
        self.batches.append(np.array(to_numpy(indices)))
        return self.prob.batch_value_and_grad(x, indices)


@pytest.mark.parametrize(
    "method, options",
    [
        ("am-mgd", {"maxiter": 40, "gtol": 0}),
        ("am-sgd", {"maxiter": 40, "gtol": 0, "batch_size": 32, "seed": 11}),
    ],
)
def test_libsvm_problem_minimised_from_a_device_x0_equals_the_numpy_run(dev, method, options):
    prob = LogisticRegression.from_libsvm("a1a", l2=1e-3)
    opts = {"lr": (1.0 / prob.L if method == "am-mgd" else 0.5 / prob.L_max), **options}
    on_dev, on_host = [], []

    def keep(store):
        def cb(intermediate_result):
            store.append(np.array(to_numpy(intermediate_result.x), dtype=np.float64))

        return cb

    dev_fun = _Recorded(prob)
    rd = amopt.minimize(dev_fun, dev(np.zeros(prob.dim)), method=method, options=opts,
                        callback=keep(on_dev))  # fmt: skip
    # the NumPy run sees the very batches the device run drew (however they were drawn)
    host_fun = _Recorded(prob, replay=dev_fun.batches)
    rh = amopt.minimize(host_fun, np.zeros(prob.dim), method=method, options=opts,
                        callback=keep(on_host))  # fmt: skip
    assert rd.nit == rh.nit == options["maxiter"] and len(on_dev) == len(on_host) == rd.nit
    if method == "am-sgd":
        assert len(dev_fun.batches) >= rd.nit
    err = np.max(np.abs(np.array(on_dev) - np.array(on_host)))
    assert err <= 1e-10 * max(1.0, float(np.max(np.abs(on_host)))), err
    _assert_close64(rd.x, rh.x, "final x")
    assert abs(float(rd.fun) - float(rh.fun)) <= 1e-10 * max(1.0, abs(float(rh.fun)))
