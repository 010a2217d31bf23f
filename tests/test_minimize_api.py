"""The scipy-shaped surface of ``amopt.minimize``: options, errors, callbacks, statuses."""

import inspect
import re
import warnings

import array_api_compat.numpy as npx
import numpy as np
import pytest
import scipy.optimize
from scipy.optimize import OptimizeWarning

import amopt

from _objectives import DIAG_X_STAR as X_STAR
from _objectives import Logistic, logreg_data
from _objectives import diag_f as f
from _objectives import diag_g as g
from oracle import run_am_mgd


def fg(x):
    return f(x), g(x)


F_STAR = f(X_STAR)


# --------------------------------------------------------------------------- results


# Exact-numerator AM-MGD with beta_max = 1 is left out on purpose: on this
# quadratic its beta settles near 0.99 and it needs far more than 20000 steps
# (see docs on the exact vs linearised numerator).
@pytest.mark.parametrize(
    ("method", "extra"),
    [("gd", {}), ("mgd", {}), ("am-mgd", {"numerator": "linear"}), ("adam", {}), ("am-adam", {})],
)
def test_converges_to_the_solution_with_gtol(method, extra):
    lr = 0.1 if "adam" not in method else 0.05
    res = amopt.minimize(
        f,
        np.zeros(3),
        method=method,
        jac=g,
        options={"lr": lr, "gtol": 1e-9, "maxiter": 20000, **extra},
    )
    assert res.success and res.status == 0, res.message
    assert np.max(np.abs(res.jac)) <= 1e-9
    np.testing.assert_allclose(res.x, X_STAR, atol=1e-8)
    assert res.fun == pytest.approx(F_STAR, abs=1e-14)
    # one evaluation at x0 plus one per step
    assert res.nfev == res.njev == res.nit + 1


def test_result_fields_and_betas_shape():
    res = amopt.minimize(fg, np.zeros(3), jac=True, options={"lr": 0.1, "maxiter": 7, "gtol": 0})
    assert res.nit == 7 and res.status == 1 and not res.success
    assert res.message == amopt.STATUS_MESSAGES["maxiter"][1]
    assert isinstance(res.betas, np.ndarray) and res.betas.shape == (7,)
    assert res.betas[0] == 0.0  # step 0: d = g
    assert res.fun == pytest.approx(f(res.x), rel=1e-15)
    np.testing.assert_allclose(res.jac, g(res.x), rtol=1e-15)


def test_gtol_zero_runs_exactly_maxiter():
    res = amopt.minimize(f, np.array(X_STAR), jac=g, options={"gtol": 0, "maxiter": 13})
    assert res.nit == 13  # even starting at the optimum


def test_tol_is_gtol():
    res = amopt.minimize(f, np.zeros(3), jac=g, tol=1e-3, options={"lr": 0.1})
    assert res.success and np.max(np.abs(res.jac)) <= 1e-3 < np.max(np.abs(g(np.zeros(3))))


def test_list_of_numbers_and_integer_x0():
    res = amopt.minimize(f, [0, 0, 0], jac=g, options={"lr": 0.1, "maxiter": 5, "gtol": 0})
    assert isinstance(res.x, np.ndarray) and res.x.dtype == np.float64


def test_jac_callable_true_and_finite_differences_agree():
    opts = {"lr": 0.1, "maxiter": 30, "gtol": 0}
    r1 = amopt.minimize(f, np.zeros(3), jac=g, options=opts)
    r2 = amopt.minimize(fg, np.zeros(3), jac=True, options=opts)
    np.testing.assert_array_equal(r1.x, r2.x)
    with pytest.warns(OptimizeWarning, match="finite differences"):
        r3 = amopt.minimize(f, np.zeros(3), options=opts)
    np.testing.assert_allclose(r3.x, r1.x, atol=1e-6)
    # forward differences: n + 1 = 4 evaluations per gradient
    assert r3.nfev == 4 * (r3.nit + 1)


def test_finite_differences_on_a_parameter_list():
    def fl(xs):
        return float(np.sum(xs[0] ** 2) + 3 * np.sum((xs[1] - 1) ** 2))

    with pytest.warns(OptimizeWarning):
        res = amopt.minimize(
            fl,
            [np.ones((2, 2)), np.zeros(3)],
            method="gd",
            options={"lr": 0.1, "gtol": 1e-6, "maxiter": 500},
        )
    assert isinstance(res.x, list) and res.x[0].shape == (2, 2)
    np.testing.assert_allclose(res.x[1], 1.0, atol=1e-5)


def test_finite_differences_refused_off_numpy():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"jac=None \(finite differences\) is supported only"):
        amopt.minimize(lambda x: (x * x).sum(), torch.ones(3, dtype=torch.float64))


def test_args_are_passed():
    res = amopt.minimize(
        lambda x, c: 0.5 * float(x @ x) - c * x.sum(),
        np.zeros(2),
        args=(2.0,),
        jac=lambda x, c: x - c,
        options={"lr": 0.5, "gtol": 1e-10},
    )
    np.testing.assert_allclose(res.x, [2.0, 2.0])


def test_per_layer_betas_shape_and_values_against_oracle():
    xs0 = [np.zeros(2), np.zeros(1)]

    def fun(xs):
        x = np.concatenate(xs)
        return f(x), [g(x)[:2], g(x)[2:]]

    res = amopt.minimize(
        fun, xs0, jac=True,
        options={"lr": 0.1, "per_layer": True, "maxiter": 10, "gtol": 0, "numerator": "exact"},
    )  # fmt: skip
    assert isinstance(res.x, list) and res.betas.shape == (10, 2)
    want = run_am_mgd(lambda x, t: (fun(x)[0], fun(x)[1]), xs0, lr=0.1, n_steps=10, per_layer=True)
    np.testing.assert_allclose(res.betas, want["betas"], atol=1e-9)
    np.testing.assert_allclose(np.concatenate(res.x), np.concatenate(want["x"][-1]), rtol=1e-12)


def test_tuple_x0_gives_tuple():
    res = amopt.minimize(
        lambda xs: (float(xs[0] @ xs[0]), (2 * xs[0],)),
        (np.ones(2),),
        jac=True,
        options={"lr": 0.1, "maxiter": 2},
    )
    assert isinstance(res.x, tuple)


# --------------------------------------------------------------------------- callback


def test_callback_new_style_receives_intermediate_result():
    seen = []

    def callback(intermediate_result):
        seen.append(
            (
                intermediate_result.nit,
                intermediate_result.fun,
                intermediate_result.beta,
                intermediate_result.x.copy(),
            )
        )

    res = amopt.minimize(
        f, np.zeros(3), jac=g, callback=callback, options={"lr": 0.1, "maxiter": 5, "gtol": 0}
    )
    assert [s[0] for s in seen] == [1, 2, 3, 4, 5]
    assert [s[2] for s in seen] == list(res.betas)
    assert seen[-1][1] == res.fun
    assert all(s[1] == pytest.approx(f(s[3]), rel=1e-15) for s in seen)


def test_callback_legacy_xk():
    xs = []
    amopt.minimize(
        f,
        np.zeros(3),
        jac=g,
        callback=lambda xk: xs.append(xk.copy()),
        options={"lr": 0.1, "maxiter": 3, "gtol": 0},
    )
    assert len(xs) == 3 and xs[0].shape == (3,)


def test_callback_stop_iteration():
    def callback(intermediate_result):
        if intermediate_result.nit == 4:
            raise StopIteration

    res = amopt.minimize(f, np.zeros(3), jac=g, callback=callback, options={"lr": 0.1})
    assert res.nit == 4 and res.status == 99 and not res.success
    assert res.message == "`callback` raised `StopIteration`."
    assert res.betas.shape == (4,)


# --------------------------------------------------------------------------- non-finite


def test_nonfinite_objective_stops_with_last_finite_iterate():
    # diverging GD (lr > 2/L): f overflows after a while
    with np.errstate(over="ignore", invalid="ignore"):
        res = amopt.minimize(
            f, np.ones(3), method="gd", jac=g, options={"lr": 1.0, "maxiter": 100000, "gtol": 0}
        )
    assert res.status == 2 and not res.success
    assert "NaN or infinite" in res.message
    assert np.all(np.isfinite(res.x)) and np.isfinite(res.fun)
    # the next gradient step from the returned iterate is the one that overflowed
    with np.errstate(over="ignore", invalid="ignore"):
        nxt = res.x - 1.0 * g(res.x)
        assert not (np.isfinite(f(nxt)) and np.all(np.isfinite(g(nxt))))


def test_nan_gradient_stops():
    calls = []

    def bad(x):
        calls.append(1)
        return np.full(3, np.nan) if len(calls) == 3 else g(x)

    res = amopt.minimize(f, np.zeros(3), jac=bad, options={"lr": 0.1, "maxiter": 10})
    assert res.status == 2 and res.nit == 1 and np.all(np.isfinite(res.x))


def test_nonfinite_at_x0():
    res = amopt.minimize(lambda x: np.inf, np.zeros(3), jac=lambda x: np.zeros(3))
    assert res.status == 2 and res.nit == 0
    np.testing.assert_array_equal(res.x, np.zeros(3))


# --------------------------------------------------------------------------- validation

BAD_OPTIONS = [
    ("am-mgd", {"lr": 0.0}, ValueError, r"lr must be a finite number > 0; got lr=0.0"),
    ("gd", {"lr": -1}, ValueError, r"lr must be a finite number > 0; got lr=-1"),
    ("mgd", {"lr": float("nan")}, ValueError, r"lr must not be NaN"),
    ("am-mgd", {"lr": "0.1"}, TypeError, r"lr must be a real number; got lr='0.1'"),
    ("am-mgd", {"lam": -0.1}, ValueError, r"lam must be a finite number >= 0; got lam=-0.1"),
    ("am-sgd", {"beta_max": 1.5}, ValueError, r"beta_max must be in \[0, 1\]; got beta_max=1.5"),
    ("am-mgd", {"beta_max": -0.1}, ValueError, r"beta_max must be in \[0, 1\]"),
    ("mgd", {"beta": 1.1}, ValueError, r"beta must be in \[0, 1\]; got beta=1.1"),
    ("adam", {"betas": (0.9, 1.0)}, ValueError, r"betas\[1\] must be in \[0, 1\); got"),
    ("am-adamw", {"betas": (-0.1, 0.9)}, ValueError, r"betas\[0\] must be in \[0, 1\)"),
    ("adam", {"betas": 0.9}, ValueError, r"betas must be a pair \(beta1, beta2\)"),
    ("adam", {"eps": -1e-8}, ValueError, r"eps must be a finite number >= 0; got eps=-1e-08"),
    ("adamw", {"weight_decay": -1}, ValueError, r"weight_decay must be a finite number >= 0"),
    (
        "am-mgd",
        {"numerator": "exactly"},
        ValueError,
        r"numerator must be one of 'exact', 'linear'; got numerator='exactly'",
    ),
    (
        "am-mgd",
        {"variant": "reset"},
        ValueError,
        r"variant must be one of None, 'clip', 'restart'; got variant='reset'",
    ),
    (
        "am-adamw",
        {"weight_decay_mode": "coupled"},
        ValueError,
        r"weight_decay_mode must be one of 'decoupled', 'proximal'; got",
    ),
    ("am-mgd", {"theta": 2}, ValueError, r"theta must be in \[0, 1\]; got theta=2"),
    ("am-mgd", {"beta_min": -1}, ValueError, r"beta_min must be in \[0, 1\]"),
    ("am-mgd", {"per_layer": 1}, TypeError, r"per_layer must be True or False; got per_layer=1"),
    ("am-mgd", {"maxiter": 1.5}, TypeError, r"maxiter must be an integer; got maxiter=1.5"),
    ("gd", {"maxiter": -1}, ValueError, r"maxiter must be an integer >= 0; got maxiter=-1"),
    ("gd", {"gtol": -1e-3}, ValueError, r"gtol must be a finite number >= 0"),
]


@pytest.mark.parametrize(("method", "options", "exc", "msg"), BAD_OPTIONS)
def test_invalid_options(method, options, exc, msg):
    with pytest.raises(exc, match=msg):
        amopt.minimize(f, np.zeros(3), method=method, jac=g, options=options)


def test_unknown_method_lists_methods():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "Unknown method 'bfgs'; method must be one of: gd, mgd, heavy-ball, nesterov, am-mgd"
        ),
    ):
        amopt.minimize(f, np.zeros(3), method="bfgs", jac=g)


def test_method_is_case_insensitive():
    r = amopt.minimize(f, np.zeros(3), method="AM-MGD", jac=g, options={"maxiter": 2})
    assert r.nit == 2


def test_unknown_options_warn_like_scipy():
    with pytest.warns(OptimizeWarning, match="Unknown solver options: momentum, foo"):
        amopt.minimize(f, np.zeros(3), jac=g, options={"momentum": 0.9, "foo": 1, "maxiter": 1})


@pytest.mark.parametrize("method", list(amopt.METHODS))
def test_method_signature_is_scipy_shaped_and_documented(method):
    # fun, x0, args, jac, callback; then each option as a keyword argument with its
    # default, every one described in the docstring's "Options" section
    meth = amopt.METHODS[method]
    params = list(inspect.signature(meth).parameters.values())
    assert [p.name for p in params[:5]] == ["fun", "x0", "args", "jac", "callback"]
    assert params[-1].kind is inspect.Parameter.VAR_KEYWORD
    options = params[5:-1]
    assert options and all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in options)
    assert meth.__name__ == "_minimize_" + method.replace("-", "_")
    doc = meth.__doc__.split("Options\n    -------\n", 1)[1]
    assert "%(" not in meth.__doc__
    for p in options:
        assert re.search(rf"^    (\w+, )*{p.name}\b", doc, re.M), p.name
    with pytest.warns(OptimizeWarning, match="Unknown solver options: foo"):
        if method in ("sgd", "msgd", "am-sgd"):  # a plain callable: refused after the warning
            with pytest.raises(ValueError, match=f"method '{method}' takes mini-batches"):
                meth(f, np.zeros(3), (), g, None, foo=1, maxiter=0)
        else:
            meth(f, np.zeros(3), (), g, None, foo=1, maxiter=0)


def test_core_steps_take_the_rule_options_one_by_one():
    # the options of AMConfig, at the step's defaults, before `config`
    from amopt.core.config import AMConfig

    sig = inspect.signature(amopt.am_momentum_step).parameters
    for name in ("lam", "beta_max", "numerator", "per_layer", "variant", "beta_low"):
        assert sig[name].default == getattr(AMConfig(), name)
    adam = inspect.signature(amopt.am_adam_step).parameters
    assert (adam["lam"].default, adam["numerator"].default, adam["per_layer"].default) == (
        0.1,
        "linear",
        True,
    )
    assert "beta_max" not in adam and list(adam)[-1] == "config"
    x = np.array([1.0, -2.0])
    _, _, beta = amopt.am_momentum_step(x, x, amopt.am_momentum_init(x), lr=0.1, variant="clip")
    assert float(beta) == 0.5
    steps = [
        (amopt.am_momentum_step, amopt.am_momentum_init(x)),
        (amopt.am_adam_step, amopt.am_adam_init(x)),
    ]
    for step, state in steps:
        for config in (None, AMConfig()):
            with pytest.raises(TypeError, match="unexpected keyword argument 'lamb'"):
                step(x, x, state, lr=0.1, lamb=0.1, config=config)


def test_jac_shape_mismatch():
    with pytest.raises(
        ValueError,
        match=r"jac returned an array of shape \(2,\), but x0 has "
        r"shape \(3,\)",
    ):
        amopt.minimize(f, np.zeros(3), jac=lambda x: np.zeros(2))


def test_jac_list_length_mismatch():
    with pytest.raises(ValueError, match="must return a list of 2 arrays like x0"):
        amopt.minimize(lambda xs: 0.0, [np.zeros(2), np.zeros(1)], jac=lambda xs: [np.zeros(2)])


def test_fun_must_return_scalar():
    with pytest.raises(ValueError, match=r"fun must return a scalar; got an array of shape"):
        amopt.minimize(lambda x: x, np.zeros(3), jac=g)


def test_jac_true_needs_pair():
    with pytest.raises(TypeError, match=r"with jac=True, fun must return a pair \(f, g\)"):
        amopt.minimize(f, np.zeros(3), jac=True)


def test_bad_jac_type():
    with pytest.raises(TypeError, match="jac must be callable, True or None; got jac='2-point'"):
        amopt.minimize(f, np.zeros(3), jac="2-point")


def test_complex_x0_rejected():
    with pytest.raises(TypeError, match="x0 has complex dtype complex128; amopt supports real"):
        amopt.minimize(f, np.zeros(3, dtype=complex), jac=g)


def test_fun_not_callable():
    with pytest.raises(TypeError, match="fun must be callable or a FiniteSum; got int"):
        amopt.minimize(3, np.zeros(3), jac=g)


def test_batch_size_needs_finite_sum_and_range():
    with pytest.raises(ValueError, match="batch_size=4 needs fun to be a FiniteSum"):
        amopt.minimize(f, np.zeros(3), method="adam", jac=g, options={"batch_size": 4})
    X, y = logreg_data(n=10)
    with pytest.raises(
        ValueError,
        match=r"batch_size must be an integer in \[1, 10\]; got "
        r"batch_size=11",
    ):
        amopt.minimize(Logistic(npx, X, y), np.zeros(8), method="sgd", options={"batch_size": 11})


# --------------------------------------------------------------------------- scipy


@pytest.mark.parametrize("name", ["am-mgd", "mgd", "adam"])
def test_scipy_method_matches_minimize(name):
    opts = {"lr": 0.1, "maxiter": 25, "gtol": 0}
    ours = amopt.minimize(f, np.zeros(3), method=name, jac=g, options=opts)
    theirs = scipy.optimize.minimize(
        f, np.zeros(3), jac=g, method=amopt.scipy_method(name), options=opts
    )
    np.testing.assert_array_equal(ours.x, theirs.x)
    assert theirs.nit == 25


def test_scipy_method_callback_stop_and_jac_true():
    def callback(intermediate_result):
        if intermediate_result.nit == 3:
            raise StopIteration

    res = scipy.optimize.minimize(
        fg,
        np.zeros(3),
        jac=True,
        callback=callback,
        method=amopt.scipy_method("am-mgd"),
        options={"lr": 0.1},
    )
    assert res.nit == 3 and res.status == 99


def test_scipy_method_rejects_bounds():
    with pytest.raises(ValueError, match="does not support bounds"):
        scipy.optimize.minimize(
            f, np.zeros(3), jac=g, method=amopt.scipy_method("gd"), bounds=[(0, 1)] * 3
        )


def test_no_runtime_warnings_on_a_clean_run():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        amopt.minimize(f, np.zeros(3), jac=g, options={"lr": 0.1, "maxiter": 500})
