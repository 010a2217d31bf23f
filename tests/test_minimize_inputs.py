"""What ``amopt.minimize`` accepts from the caller, and what it hands back.

Degenerate ``x0`` (0-d, empty, integer, NumPy scalars, non-finite, masked,
complex), what ``fun`` and ``jac`` may return, finite differences in each
dtype, and the copies that keep the caller's arrays and the run apart.
"""

import numpy as np
import pytest
import scipy.optimize
from scipy.optimize import OptimizeWarning

import amopt

from _objectives import DIAG_A as A
from _objectives import DIAG_B as B
from _objectives import diag_f as f
from _objectives import diag_g as g

ALL_METHODS = list(amopt.METHODS)
#: the methods a plain callable can run: the sgd-type methods need a FiniteSum
CALLABLE_METHODS = [m for m in ALL_METHODS if m not in ("sgd", "msgd", "am-sgd")]

# --------------------------------------------------------------------------- finite differences


def _fd_bound(dtype, x, fx):
    """Error bound of a forward difference of a function with f'' = 2.

    Truncation ``h f''/2 = h`` plus rounding ``2 eps |f| / h`` with the step
    ``h = sqrt(eps) * max(1, |x|)`` of the dtype; the tests allow four times it.
    """
    eps = float(np.finfo(dtype).eps)
    scale = np.maximum(1.0, np.abs(x))
    return 4 * np.sqrt(eps) * (scale + 2 * abs(fx) / scale)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_finite_difference_step_suits_the_dtype(dtype, offset):
    c = np.array([1.5, -2.0, 0.25])

    def fun(x):
        return np.sum((x - c.astype(x.dtype)) ** 2)

    x0 = np.full(3, offset, dtype=dtype)
    with pytest.warns(OptimizeWarning, match="finite differences"):
        res = amopt.minimize(fun, x0, method="gd", options={"maxiter": 0})
    exact = 2 * (x0.astype(np.float64) - c)
    assert res.jac.dtype == dtype
    bound = _fd_bound(dtype, x0.astype(np.float64), float(fun(x0)))
    assert np.all(np.abs(res.jac - exact) <= bound), (res.jac, exact, bound)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_finite_differences_reach_the_minimiser_in_float32_and_float64(dtype):
    c = np.array([1.5, -2.0, 0.25])
    sqrt_eps = np.sqrt(float(np.finfo(dtype).eps))
    gtol = 10 * sqrt_eps

    def fun(x):
        return np.sum((x - c.astype(x.dtype)) ** 2)

    with pytest.warns(OptimizeWarning):
        res = amopt.minimize(
            fun, np.zeros(3, dtype=dtype), method="gd", options={"lr": 0.25, "gtol": gtol}
        )
    assert res.success and res.nit > 0 and res.x.dtype == dtype
    # the forward-difference gradient 2 (x - c) + h vanishes within h / 2 of c, and
    # |2 (x - c) + h| <= gtol there
    np.testing.assert_allclose(res.x, c, rtol=0, atol=(gtol + 2 * sqrt_eps * 2.0) / 2)


def test_finite_differences_on_a_0d_x0():
    with pytest.warns(OptimizeWarning):
        res = amopt.minimize(
            lambda x: float((x - 3.0) ** 2), 1.0, method="gd", options={"lr": 0.25}
        )
    assert res.success and res.x.shape == ()
    assert abs(float(res.x) - 3.0) <= 1e-5


# --------------------------------------------------------------------------- what jac may return


def test_integer_gradient_is_promoted_not_truncated():
    """An integer jac gives the same run as the same values in float64."""
    opts = {"lr": 0.05, "maxiter": 25, "gtol": 0, "numerator": "linear"}
    x0 = np.array([10.0, -10.0, 5.0])
    ref = amopt.minimize(f, x0, jac=lambda x: np.rint(g(x)), options=opts)
    res = amopt.minimize(f, x0, jac=lambda x: np.rint(g(x)).astype(np.int64), options=opts)
    assert np.max(ref.betas) > 0.1  # momentum is in play
    np.testing.assert_array_equal(res.x, ref.x)
    np.testing.assert_array_equal(res.betas, ref.betas)
    assert res.jac.dtype == np.float64


@pytest.mark.parametrize("method", ["gd", "mgd", "am-mgd", "adam", "am-adamw"])
def test_float64_gradient_for_float32_x0_keeps_float32(method):
    x0 = np.array([1.0, -1.0, 0.5], dtype=np.float32)
    opts = {"lr": 0.05, "maxiter": 10, "gtol": 0}
    ref = amopt.minimize(
        f,
        x0,
        method=method,
        jac=lambda x: g(x.astype(np.float64)).astype(np.float32),
        options=opts,
    )
    res = amopt.minimize(f, x0, method=method, jac=lambda x: g(x.astype(np.float64)), options=opts)
    assert res.x.dtype == np.float32 and res.jac.dtype == np.float32
    np.testing.assert_array_equal(res.x, ref.x)


def test_gradient_as_a_list_of_numbers():
    opts = {"lr": 0.1, "maxiter": 5, "gtol": 0}
    ref = amopt.minimize(f, np.zeros(3), jac=g, options=opts)
    res = amopt.minimize(f, np.zeros(3), jac=lambda x: g(x).tolist(), options=opts)
    np.testing.assert_array_equal(res.x, ref.x)


BAD_JAC = [
    (lambda x: None, TypeError, r"jac must return an array of shape \(3,\) like x0 .*; got None"),
    (lambda x: "ab", TypeError, r"jac must return an array .*; got 'ab' \(str\)"),
    (lambda x: {}, TypeError, r"jac must return an array .*; got \{\} \(dict\)"),
    (
        lambda x: np.array([None, 1, 2]),
        TypeError,
        r"jac must return an array .*; got an array of non-numeric dtype object",
    ),
    (
        lambda x: g(x) + 0j,
        TypeError,
        r"jac must return an array .*; got an array of complex dtype complex128",
    ),
    (
        lambda x: np.zeros(2),
        ValueError,
        r"jac returned an array of shape \(2,\), but x0 has shape \(3,\)",
    ),
    (
        lambda x: np.ma.array(g(x)),
        TypeError,
        r"the gradient returned by jac is a numpy.ma.MaskedArray",
    ),
]


@pytest.mark.parametrize(("jac", "exc", "match"), BAD_JAC)
def test_bad_jac_return_is_named(jac, exc, match):
    with pytest.raises(exc, match=match):
        amopt.minimize(f, np.zeros(3), jac=jac)


def test_jac_returning_another_array_library_is_named():
    torch = pytest.importorskip("torch")
    with pytest.raises(
        TypeError,
        match=r"jac returned a torch.Tensor of shape \(3,\) and dtype torch.float64, but x0 "
        r"is a numpy.ndarray; return the gradient as the same array type as x0",
    ):
        amopt.minimize(f, np.zeros(3), jac=lambda x: torch.zeros(3, dtype=torch.float64))
    with pytest.raises(
        TypeError, match=r"jac returned a numpy.ndarray .* but x0 is a torch.Tensor"
    ):
        amopt.minimize(
            lambda x: float((x * x).sum()),
            torch.zeros(3, dtype=torch.float64),
            jac=lambda x: np.ones(3),
        )


def test_jac_true_pair_is_checked():
    with pytest.raises(
        TypeError, match=r"with jac=True, fun must return a pair \(f, g\); got 1.0 \(float\)"
    ):
        amopt.minimize(lambda x: 1.0, np.zeros(3), jac=True)
    with pytest.raises(TypeError, match=r"fun \(jac=True\) must return an array .*; got None"):
        amopt.minimize(lambda x: (1.0, None), np.zeros(3), jac=True)


# --------------------------------------------------------------------------- what fun may return

BAD_FUN = [
    (lambda x: None, TypeError, r"fun must return a real scalar; got None"),
    (lambda x: "1.0", TypeError, r"fun must return a real scalar; got '1.0' \(str\)"),
    (lambda x: 1.0 + 1.0j, TypeError, r"fun must return a real scalar; got \(1\+1j\) \(complex\)"),
    (
        lambda x: np.complex128(1.0 + 1.0j),
        TypeError,
        r"fun must return a real scalar; got .* \(numpy.complex128\)",
    ),
    (lambda x: [1.0], TypeError, r"fun must return a real scalar; got \[1.0\] \(list\)"),
    (lambda x: x, ValueError, r"fun must return a scalar; got an array of shape \(3,\)"),
    (
        lambda x: np.array(["a"]),
        TypeError,
        r"fun must return a real scalar; got a numpy.ndarray of shape \(1,\) and dtype <U1",
    ),
]


@pytest.mark.parametrize(("fun", "exc", "match"), BAD_FUN)
def test_bad_fun_return_is_named(fun, exc, match):
    with pytest.raises(exc, match=match):
        amopt.minimize(fun, np.zeros(3), jac=g)


@pytest.mark.parametrize(
    "value", [np.float32(2.5), np.int64(2), 2, np.array(2.5), np.array([2.5], dtype=np.float32)]
)
def test_real_scalars_of_any_kind_are_accepted(value):
    res = amopt.minimize(lambda x: value, np.zeros(3), jac=g, options={"maxiter": 1, "gtol": 0})
    assert res.fun == float(np.asarray(value).reshape(()))


# --------------------------------------------------------------------------- x0


@pytest.mark.parametrize("method", CALLABLE_METHODS)
def test_0d_x0_keeps_its_shape_and_matches_the_1_element_run(method):
    opts = {"lr": 0.05, "maxiter": 12, "gtol": 0}
    shapes = []

    def fun(x):
        shapes.append(x.shape)
        return float(np.sum(2.0 * (x - 1.5) ** 2))

    def jac(x):
        return 4.0 * (x - 1.5)

    ref = amopt.minimize(fun, np.array([0.25]), method=method, jac=jac, options=opts)
    shapes.clear()
    res = amopt.minimize(fun, np.array(0.25), method=method, jac=jac, options=opts)
    assert set(shapes) == {()}
    assert isinstance(res.x, np.ndarray) and res.x.shape == () and res.jac.shape == ()
    np.testing.assert_array_equal(res.x, ref.x[0])
    if "betas" in ref:
        np.testing.assert_array_equal(res.betas, ref.betas)
    # a Python number is a 0-d x0 too
    res = amopt.minimize(fun, 0.25, method=method, jac=jac, options=opts)
    assert res.x.shape == () and float(res.x) == float(ref.x[0])


def test_list_of_numpy_scalars_is_a_vector():
    opts = {"lr": 0.1, "maxiter": 5, "gtol": 0}
    ref = amopt.minimize(f, [1.0, 2.0, 3.0], jac=g, options=opts)
    res = amopt.minimize(f, [np.float64(1), np.float32(2), np.int64(3)], jac=g, options=opts)
    assert isinstance(res.x, np.ndarray) and res.x.dtype == np.float64
    np.testing.assert_array_equal(res.x, ref.x)


def test_integer_x0_is_promoted_to_float64():
    opts = {"lr": 0.1, "maxiter": 5, "gtol": 0}
    ref = amopt.minimize(f, np.array([1.0, 2.0, 3.0]), jac=g, options=opts)
    res = amopt.minimize(f, np.array([1, 2, 3], dtype=np.int32), jac=g, options=opts)
    assert res.x.dtype == np.float64
    np.testing.assert_array_equal(res.x, ref.x)


@pytest.mark.parametrize("method", CALLABLE_METHODS)
def test_empty_x0_is_already_optimal(method):
    # minimising over R^0: x0 is the minimiser, and the gradient is empty
    res = amopt.minimize(
        lambda x: 7.0, np.zeros(0), method=method, jac=lambda x: x, options={"gtol": 1e-5}
    )
    assert res.success and res.status == 0 and res.nit == 0
    assert res.x.shape == (0,) and res.fun == 7.0
    res = amopt.minimize(
        lambda x: 7.0,
        np.zeros(0),
        method=method,
        jac=lambda x: x,
        options={"gtol": 0, "maxiter": 3},
    )
    assert res.nit == 3 and res.x.shape == (0,)


def test_empty_array_in_a_parameter_list():
    res = amopt.minimize(
        lambda xs: float(xs[0] @ xs[0]),
        [np.ones(2), np.zeros(0)],
        jac=lambda xs: [2 * xs[0], np.zeros(0)],
        options={"lr": 0.25, "per_layer": True, "gtol": 1e-10},
    )
    assert res.success and res.x[1].shape == (0,)
    np.testing.assert_allclose(res.x[0], 0.0, atol=1e-10)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_x0_stops_before_any_step(bad):
    x0 = np.array([1.0, bad, 0.0])
    calls = []

    def fun(x):
        calls.append(x.copy())
        return 0.0

    res = amopt.minimize(fun, x0, jac=np.zeros_like, options={"maxiter": 5})
    assert res.status == 2 and not res.success and res.nit == 0
    assert res.message == amopt.STATUS_MESSAGES["nonfinite_x0"][1]
    np.testing.assert_array_equal(res.x, x0)
    assert len(calls) == 1  # fun is evaluated once, to report res.fun


def test_masked_x0_is_rejected():
    with pytest.raises(TypeError, match=r"x0 is a numpy.ma.MaskedArray"):
        amopt.minimize(f, np.ma.array([1.0, 2.0, 3.0], mask=[0, 1, 0]), jac=g)
    with pytest.raises(TypeError, match=r"x0\[1\] is a numpy.ma.MaskedArray"):
        amopt.minimize(
            lambda xs: 0.0, [np.zeros(2), np.ma.zeros(2)], jac=lambda xs: [np.zeros(2)] * 2
        )


@pytest.mark.parametrize(
    ("x0", "exc", "match"),
    [
        ([1j, 2.0], TypeError, r"x0 has complex dtype complex128"),
        (None, TypeError, r"x0 must be an array, a number or a list of numbers; got None"),
        ([[1.0], [2.0, 3.0]], ValueError, r"x0 must be an array, a number, a \(nested\) list"),
        (["a", "b"], TypeError, r"x0 must have a real floating dtype; got dtype <U1"),
    ],
)
def test_bad_x0_is_named(x0, exc, match):
    with pytest.raises(exc, match=match):
        amopt.minimize(f, x0, jac=g)


# --------------------------------------------------------------------------- copies


@pytest.mark.parametrize("maxiter", [0, 3])
def test_result_never_aliases_x0_and_x0_is_untouched(maxiter):
    x0 = np.array([1.0, 2.0, 3.0])
    res = amopt.minimize(f, x0, jac=g, options={"lr": 0.1, "maxiter": maxiter, "gtol": 0})
    assert not np.shares_memory(res.x, x0)
    np.testing.assert_array_equal(x0, [1.0, 2.0, 3.0])
    res.x[:] = -1.0
    np.testing.assert_array_equal(x0, [1.0, 2.0, 3.0])


@pytest.mark.parametrize("method", ["mgd", "am-mgd", "adam"])
def test_a_jac_that_reuses_its_output_buffer(method):
    buffer = np.empty(3)

    def jac_into_buffer(x):
        np.subtract(A @ x, B, out=buffer)
        return buffer

    opts = {"lr": 0.05, "maxiter": 10, "gtol": 0}
    ref = amopt.minimize(f, np.ones(3), method=method, jac=g, options=opts)
    res = amopt.minimize(f, np.ones(3), method=method, jac=jac_into_buffer, options=opts)
    np.testing.assert_array_equal(res.x, ref.x)
    assert not np.shares_memory(res.jac, buffer)
    np.testing.assert_array_equal(res.jac, g(res.x))


def _vandal_new_style(intermediate_result):
    intermediate_result.x[...] = 100.0
    intermediate_result.jac[...] = 0.0


def _vandal_legacy(xk):
    xk[...] = 100.0


@pytest.mark.parametrize("callback", [_vandal_new_style, _vandal_legacy])
@pytest.mark.parametrize("method", ["gd", "am-mgd", "am-adam"])
def test_callback_gets_copies(method, callback):
    opts = {"lr": 0.05, "maxiter": 8, "gtol": 0}
    ref = amopt.minimize(f, np.ones(3), method=method, jac=g, options=opts)
    res = amopt.minimize(f, np.ones(3), method=method, jac=g, callback=callback, options=opts)
    np.testing.assert_array_equal(res.x, ref.x)
    np.testing.assert_array_equal(res.jac, ref.jac)
    if "betas" in ref:
        np.testing.assert_array_equal(res.betas, ref.betas)


@pytest.mark.parametrize("callback", [_vandal_new_style, _vandal_legacy])
def test_callback_gets_copies_through_scipy(callback):
    opts = {"lr": 0.05, "maxiter": 8, "gtol": 0}
    ref = amopt.minimize(f, np.ones(3), jac=g, options=opts)
    res = scipy.optimize.minimize(
        f, np.ones(3), jac=g, callback=callback, method=amopt.scipy_method("am-mgd"), options=opts
    )
    np.testing.assert_array_equal(res.x, ref.x)


# --------------------------------------------------------------------------- other arguments


def test_callback_must_be_callable():
    with pytest.raises(TypeError, match=r"callback must be callable .*; got callback=3"):
        amopt.minimize(f, np.zeros(3), jac=g, callback=3)


def test_options_must_be_a_dict():
    with pytest.raises(
        TypeError, match=r"options must be a dict of method options or None; got list"
    ):
        amopt.minimize(f, np.zeros(3), jac=g, options=[("lr", 0.1)])


@pytest.mark.parametrize(
    ("method", "options", "ignored"),
    [
        ("adam", {"seed": 0}, "seed is ignored"),
        ("am-adamw", {"replace": True}, "replace is ignored"),
        ("adamw", {"seed": 0, "replace": True}, "seed and replace are ignored"),
    ],
)
def test_sampling_options_without_sampling_warn(method, options, ignored):
    # a plain callable fun: nothing is sampled
    with pytest.warns(OptimizeWarning, match=ignored):
        amopt.minimize(f, np.zeros(3), method=method, jac=g, options={"maxiter": 2, **options})


def test_batch_size_to_a_full_batch_method_warns():
    with pytest.warns(OptimizeWarning, match="Unknown solver options: batch_size"):
        amopt.minimize(f, np.zeros(3), method="gd", jac=g, options={"batch_size": 4, "maxiter": 1})
