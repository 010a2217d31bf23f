"""The same runs on every backend (numpy, array-api-strict, torch, cupy when present) agree.

Each backend runs ``minimize`` on its own arrays (the objective is written over
the array API), the result keeps the caller's array type, and float64 results
agree with NumPy's to 1e-12; float32 runs agree to float32 accuracy.
"""

import importlib.util

import array_api_compat
import array_api_compat.numpy as npx
import numpy as np
import pytest

import amopt
from amopt.backends import library_available, to_numpy

from _objectives import Logistic, Quadratic, logreg_data, quadratic_data
from conftest import Backend

CASES = [
    ("am-mgd", {"numerator": "exact"}),
    ("am-mgd", {"numerator": "linear", "lam": 0.1, "beta_max": 0.9, "variant": "clip"}),
    ("mgd", {"beta": 0.9}),
    ("gd", {}),
    ("adam", {"lr": 0.05}),
    ("am-adamw", {"lr": 0.05, "weight_decay_mode": "proximal"}),
    ("am-adam", {"lr": 0.05, "numerator": "exact", "variant": "restart"}),
]
N = 30


def _make(xp, kind, dtype):
    if kind == "quadratic":
        A, b = quadratic_data()
        prob = Quadratic(xp, A, b)
        x0 = xp.zeros(12, dtype=dtype)
    else:
        X, y = logreg_data()
        prob = Logistic(xp, X, y)
        x0 = xp.full(8, 0.1, dtype=dtype)
    return prob, x0


def _run(xp, kind, method, options, dtype):
    prob, x0 = _make(xp, kind, dtype)
    lr = 1.0 / prob.L
    res = amopt.minimize(
        prob,
        x0,
        method=method,
        jac=prob.grad,
        options={"lr": lr, "maxiter": N, "gtol": 0, **options},
    )
    return res


@pytest.mark.parametrize("kind", ["quadratic", "logistic"])
@pytest.mark.parametrize(("method", "options"), CASES)
def test_float64_agrees_with_numpy(xp, backend, kind, method, options):
    ref = _run(npx, kind, method, options, npx.float64)
    res = _run(xp, kind, method, options, xp.float64)
    assert array_api_compat.array_namespace(res.x) is array_api_compat.array_namespace(xp.zeros(1))
    assert res.x.dtype == xp.float64
    np.testing.assert_allclose(to_numpy(res.x), ref.x, rtol=1e-12, atol=1e-13)
    assert res.fun == pytest.approx(ref.fun, rel=1e-12)
    if "betas" in ref:
        np.testing.assert_allclose(res.betas, ref.betas, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kind", ["quadratic", "logistic"])
@pytest.mark.parametrize(("method", "options"), CASES[:3])
def test_float32_close_to_float64(xp, backend, kind, method, options):
    ref = _run(npx, kind, method, options, npx.float64)
    res = _run(xp, kind, method, options, xp.float32)
    assert res.x.dtype == xp.float32
    np.testing.assert_allclose(to_numpy(res.x), ref.x, rtol=2e-3, atol=2e-4)


def test_torch_keeps_device_and_type():
    torch = pytest.importorskip("torch")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        x0 = torch.zeros(3, dtype=torch.float64, device=dev)
        a = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, device=dev)
        res = amopt.minimize(
            lambda x, a=a: 0.5 * torch.sum(a * x * x) - x.sum(),
            x0,
            jac=lambda x, a=a: a * x - 1.0,
            options={"lr": 0.3, "gtol": 1e-10, "numerator": "linear"},
        )
        assert isinstance(res.x, torch.Tensor) and res.x.device.type == dev
        np.testing.assert_allclose(res.x.cpu().numpy(), 1.0 / np.array([1.0, 2.0, 3.0]), rtol=1e-9)


def test_torch_parameter_list_per_layer():
    torch = pytest.importorskip("torch")
    w0, b0 = torch.zeros(4, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)

    def fun(params):
        w, b = params
        return 0.5 * ((w - 1.0) ** 2).sum() + ((b + 2.0) ** 2).sum(), [w - 1.0, 2 * (b + 2.0)]

    res = amopt.minimize(
        fun,
        [w0, b0],
        jac=True,
        method="am-adamw",
        options={"lr": 0.05, "weight_decay": 0.0, "maxiter": 3000, "gtol": 1e-8},
    )
    assert res.success and isinstance(res.x[0], torch.Tensor)
    assert res.betas.ndim == 2 and res.betas.shape[1] == 2
    np.testing.assert_allclose(res.x[1].numpy(), -2.0, atol=1e-6)


def test_half_precision_core_never_nan():
    """float16 parameters: reductions accumulate in float64, so |g| up to 6e4 is fine."""
    g = np.array([6.0e4, -3.0e4, 1.0], dtype=np.float16)
    d = np.array([-6.0e4, 3.0e4, 0.5], dtype=np.float16)
    beta = amopt.am_beta(g, d, lam=0.1, beta_max=0.9)
    assert beta.dtype == np.float64
    # float64 reference of the same rule
    g64, d64 = g.astype(np.float64), d.astype(np.float64)
    v = d64 - g64
    want = np.clip((1.1 * g64 @ g64 - 0.1 * v @ v) / (v @ v), 0, 0.9)
    assert float(beta) == pytest.approx(want, rel=1e-6)


def test_backend_enum_always_lists_numpy_and_strict():
    avail = Backend.available()
    assert Backend.NUMPY in avail and Backend.ARRAY_API_STRICT in avail
    x = Backend.ARRAY_API_STRICT.namespace().asarray([1.0, 2.0])
    np.testing.assert_array_equal(to_numpy(x), [1.0, 2.0])


def test_library_available_answers_for_installed_and_missing_libraries():
    assert library_available("numpy") and library_available("array_api_strict")
    assert not library_available("no_such_array_library")
    assert library_available("torch") == (importlib.util.find_spec("torch") is not None)


def test_backend_is_not_part_of_the_package():
    import amopt.backends

    assert "Backend" not in amopt.backends.__all__
    assert not hasattr(amopt.backends, "Backend")
