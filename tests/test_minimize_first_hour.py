"""What a new user meets first: problem objects as objectives, honest statuses, options
that can be found, a step size when none is given, the classical momentum baselines and
a default that converges."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.optimize import OptimizeWarning

import amopt
from amopt.problems import LeastSquares, Quadratic, Rosenbrock

from oracle import run_am_mgd

# ----------------------------------------------------------------------------- E


@pytest.mark.parametrize("make", [lambda: Quadratic.from_spectrum(50, cond=10), Rosenbrock])
def test_problem_objects_use_their_gradient(make):
    prob = make()
    x0 = np.full(prob.dim, 0.5)
    calls = {"fun": 0, "vg": 0}
    fun, vg = prob.fun, prob.value_and_grad

    def counted_fun(x):
        calls["fun"] += 1
        return fun(x)

    def counted_vg(x):
        calls["vg"] += 1
        return vg(x)

    prob.fun, prob.value_and_grad = counted_fun, counted_vg
    lr = 1.0 / prob.L if hasattr(prob, "L") else 1e-3
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizeWarning)  # no finite-difference warning
        res = amopt.minimize(
            prob, x0, method="gd", options={"lr": lr, "gtol": 1e-6, "maxiter": 60_000}
        )
    assert calls["fun"] == 0  # no finite-difference evaluations of fun
    assert calls["vg"] == res.nfev == res.njev == res.nit + 1
    assert res.success
    assert np.max(np.abs(prob.grad(res.x))) <= 1e-6
    np.testing.assert_allclose(res.x, prob.x_star, atol=1e-6 / getattr(prob, "mu", 1e-3))


def test_object_with_grad_method_only():
    """An object with ``__call__`` and ``grad`` (no value_and_grad) uses ``grad``."""
    q = Quadratic.from_spectrum(20, cond=10)

    class Obj:
        def __call__(self, x):
            return q.fun(x)

        def grad(self, x):
            return q.grad(x)

    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizeWarning)
        res = amopt.minimize(Obj(), np.ones(20), method="gd", options={"lr": 1 / q.L})
    assert res.success and res.nfev == res.nit + 1


# ----------------------------------------------------------------------------- G


def _q100():
    """Condition 100, f* = 0 at x* = 0."""
    return Quadratic.from_spectrum(10, cond=100, seed=0, b=np.zeros(10))


@pytest.mark.parametrize("array", ["numpy", "torch"])
def test_a_run_that_ends_above_f_x0_says_it_diverged(array):
    """AM-MGD (the paper's exact rule) at lr = 10/L stays finite but ends above f(x0)."""
    q = _q100()
    x0 = np.ones(10)
    f0 = float(q.fun(x0))
    if array == "torch":
        torch = pytest.importorskip("torch")
        x0 = torch.ones(10, dtype=torch.float64)
    opts = {"lr": 10 / q.L, "maxiter": 200, "numerator": "exact"}
    res = amopt.minimize(q, x0, method="am-mgd", options=opts)
    assert np.isfinite(res.fun) and res.fun > f0  # the situation tested
    assert res.status == 2 and not res.success
    assert res.message == amopt.STATUS_MESSAGES["increased"][1]
    # a run that converges at the same maxiter keeps status 1 or 0
    res = amopt.minimize(q, x0, method="am-mgd", options={"lr": 1 / q.L, "maxiter": 5})
    assert res.status == 1 and res.fun < f0


@pytest.mark.parametrize("method", ["sgd", "msgd", "am-sgd"])
def test_mini_batch_method_refuses_a_plain_callable(method):
    q = _q100()
    with pytest.raises(ValueError, match=rf"method '{method}' takes mini-batches.*fun="):
        amopt.minimize(lambda x: q.fun(x), np.ones(10), method=method, jac=q.grad)


def test_maxiter_is_status_1_for_every_method():
    rng = np.random.default_rng(0)
    prob = LeastSquares(rng.standard_normal((40, 5)), rng.standard_normal(40))
    for method in amopt.METHODS:
        res = amopt.minimize(prob, np.zeros(5), method=method, options={"lr": 0.01, "maxiter": 3})
        assert res.nit == 3, method
        assert res.status == 1 and not res.success, method
        assert res.message == amopt.STATUS_MESSAGES["maxiter"][1], method


# ----------------------------------------------------------------------------- F


def test_show_options_is_scipy_shaped():
    import inspect

    for name, meth in amopt.METHODS.items():
        text = amopt.show_options(name, disp=False)
        assert text == inspect.cleandoc(meth.__doc__)
        assert "Options\n-------" in text
        for p in list(inspect.signature(meth).parameters.values())[5:-1]:
            assert p.name in text, (name, p.name)
    every = amopt.show_options(disp=False)
    for name in amopt.METHODS:
        assert f"\n\n{name}\n{'=' * len(name)}\n\n" in every
    with pytest.raises(ValueError, match="Unknown method 'nope'"):
        amopt.show_options("nope")


def test_show_options_prints_with_disp(capsys):
    assert amopt.show_options("gd") is None
    assert capsys.readouterr().out.strip() == amopt.show_options("gd", disp=False)


def test_help_of_minimize_lists_every_method_and_its_defaults():
    import inspect

    doc = amopt.minimize.__doc__
    for name, meth in amopt.METHODS.items():
        assert f"``{name!r}``" in doc
        params = list(inspect.signature(meth).parameters.values())[5:-1]
        assert "Options: " + ", ".join(f"{p.name}={p.default!r}" for p in params) in doc


def test_disp_prints_the_final_message_as_scipy(capsys):
    q = _q100()
    res = amopt.minimize(q, np.ones(10), method="gd", options={"lr": 1 / q.L, "disp": True})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == res.message
    assert out[1].split(":")[1].strip() == f"{res.fun:f}"
    assert out[2:] == [
        f"         Iterations: {res.nit}",
        f"         Function evaluations: {res.nfev}",
        f"         Gradient evaluations: {res.njev}",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizeWarning)  # disp is a known option
        res = amopt.minimize(
            q, np.ones(10), method="gd", options={"lr": 1 / q.L, "maxiter": 2, "disp": True}
        )
    assert capsys.readouterr().out.startswith("Warning: " + res.message)


def test_scipy_show_options_with_an_amopt_method_points_to_amopt():
    import scipy.optimize

    meth = amopt.scipy_method("am-mgd")
    with pytest.raises(ValueError, match=r"amopt.show_options\('am-mgd'\)"):
        scipy.optimize.show_options("minimize", meth)
    res = scipy.optimize.minimize(
        lambda x: float(x @ x), np.ones(3), jac=lambda x: 2 * x, method=meth, options={"lr": 0.25}
    )
    assert res.success


# ----------------------------------------------------------------------------- D


@pytest.mark.parametrize("method", ["gd", "mgd", "heavy-ball", "nesterov"])
def test_without_lr_a_problem_object_steps_at_1_over_L(method):
    if method not in amopt.METHODS:
        pytest.skip(f"{method} not declared")
    q = Quadratic.from_spectrum(20, cond=100, seed=0)
    res = amopt.minimize(q, np.ones(20), method=method)
    assert res.lr == 1.0 / q.L
    assert res.status == 0, res.message  # gtol 1e-5 within the default maxiter
    ref = amopt.minimize(q, np.ones(20), method=method, options={"lr": 1.0 / q.L})
    np.testing.assert_array_equal(res.x, ref.x)
    assert res.nit == ref.nit and res.nfev == ref.nfev


def test_without_lr_a_plain_callable_gets_an_estimated_1_over_L():
    q = Quadratic.from_spectrum(20, cond=100, seed=0)
    calls = []

    def fun(x):
        calls.append(1)
        return float(q.fun(x))

    res = amopt.minimize(fun, np.ones(20), jac=q.grad, method="gd")
    # the power iteration's estimate of L is at most L (a Rayleigh quotient) and close
    assert 1.0 / q.L <= res.lr <= 1.02 / q.L
    assert res.status == 0, res.message
    assert res.nfev == len(calls) > res.nit + 1  # the estimate's evaluations are counted
    # a non-quadratic objective: the curvature of cosh at x0 = 4 is the largest on the
    # way to 0, so 1/L estimated there is a safe step
    res = amopt.minimize(
        lambda x: float(np.sum(np.cosh(x))),
        np.full(3, 4.0),
        jac=np.sinh,
        method="gd",
        options={"gtol": 1e-8},
    )
    assert res.success and np.max(np.abs(res.x)) < 1e-7


def test_adam_family_keeps_torch_lr():
    import inspect

    for name in ("adam", "adamw", "am-adam", "am-adamw"):
        assert inspect.signature(amopt.METHODS[name]).parameters["lr"].default == 1e-3


# ----------------------------------------------------------------------------- A


def _reference_momentum(a, x0, lr, beta, nesterov, T):
    """Classical momentum written out from its definition (NumPy, diagonal quadratic).

    Heavy ball: x_{t+1} = x_t - lr g_t + beta (x_t - x_{t-1}) with x_{-1} = x_0.
    Nesterov (torch's SGD(nesterov=True)): b = beta b + g (b_0 = g_0), x -= lr (g + beta b).
    """
    x, x_prev, b = x0.copy(), x0.copy(), None
    out = [x.copy()]
    for _ in range(T):
        g = a * x
        if nesterov:
            b = g.copy() if b is None else beta * b + g
            x = x - lr * (g + beta * b)
        else:
            x, x_prev = x - lr * g + beta * (x - x_prev), x
        out.append(x.copy())
    return out


def _namespaces():
    kinds = ["numpy", "list"]
    try:
        import torch  # noqa: F401

        kinds.append("torch")
    except ImportError:
        pass
    try:
        import array_api_strict  # noqa: F401

        kinds.append("array_api_strict")
    except ImportError:
        pass
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            kinds.append("cupy")
    except Exception:  # noqa: BLE001 - no CuPy or no GPU
        pass
    return kinds


@pytest.mark.parametrize("kind", _namespaces())
@pytest.mark.parametrize("method", ["heavy-ball", "nesterov"])
def test_classical_momentum_matches_its_definition_on_every_array_kind(method, kind):
    a = np.geomspace(0.01, 1.0, 12)
    x0 = np.linspace(-1.0, 2.0, 12)
    lr, beta, T = 0.9, 0.8, 40
    want = _reference_momentum(a, x0, lr, beta, method == "nesterov", T)
    if kind == "list":  # a parameter list: two arrays, one objective
        conv, back = (lambda v: [v[:5].copy(), v[5:].copy()]), (lambda v: np.concatenate(v))
    elif kind == "numpy":
        conv, back = np.array, np.asarray
    elif kind == "torch":
        import torch

        conv, back = (lambda v: torch.tensor(v, dtype=torch.float64)), (lambda t: t.numpy())
    elif kind == "cupy":
        import cupy

        conv, back = cupy.asarray, cupy.asnumpy
    else:
        import array_api_strict as xps

        conv, back = (lambda v: xps.asarray(v)), (lambda t: np.asarray(t))
    A = conv(a)

    if kind == "list":

        def fun(xs):
            return float(0.5 * (a[:5] * xs[0]) @ xs[0] + 0.5 * (a[5:] * xs[1]) @ xs[1])

        def jac(xs):
            return [a[:5] * xs[0], a[5:] * xs[1]]

    else:
        xp = amopt.core.xp.array_namespace(A)

        def fun(x):
            return 0.5 * xp.sum(A * x * x)

        def jac(x):
            return A * x

    got = [x0.copy()]
    res = amopt.minimize(
        fun,
        conv(x0),
        jac=jac,
        method=method,
        options={"lr": lr, "beta": beta, "maxiter": T, "gtol": 0.0},
        callback=lambda intermediate_result: got.append(back(intermediate_result.x)),
    )
    assert res.nit == T and res.status == 1
    # the same operations in another order: agreement to a few ulps of the values
    for g_t, w_t in zip(got, want, strict=True):
        np.testing.assert_allclose(g_t, w_t, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(back(res.x), want[-1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("cond", [10.0, 100.0, 1e4])
def test_heavy_ball_and_nesterov_reach_their_textbook_rates(cond):
    """At the textbook tuning from L and mu, on a quadratic, |x_T - x*| <= (T+1) rho^T |x_0 - x*|.

    Heavy ball: lr = 4/(sqrt L + sqrt mu)^2, beta = ((sqrt k - 1)/(sqrt k + 1))^2,
    rho = (sqrt k - 1)/(sqrt k + 1) (the spectral radius of its iteration; (T+1)
    bounds the growth of its Jordan blocks). Nesterov: lr = 1/L, beta = (sqrt k - 1)/
    (sqrt k + 1), rho = 1 - 1/sqrt k. Gradient descent's rate (k-1)/(k+1) is far slower.
    """
    q = Quadratic.from_spectrum(30, cond=cond, L=2.0, seed=1, b=np.zeros(30))
    L, mu, sk = q.L, q.mu, np.sqrt(cond)
    x0 = np.random.default_rng(0).standard_normal(30)
    e0 = np.linalg.norm(x0)
    for T in (50, 200):
        hb = amopt.minimize(
            q,
            x0,
            method="heavy-ball",
            options={
                "lr": 4 / (np.sqrt(L) + np.sqrt(mu)) ** 2,
                "beta": ((sk - 1) / (sk + 1)) ** 2,
                "maxiter": T,
                "gtol": 0.0,
            },
        )
        rho = (sk - 1) / (sk + 1)
        assert np.linalg.norm(hb.x) <= (T + 1) * rho**T * e0 + 1e-300
        nag = amopt.minimize(
            q,
            x0,
            method="nesterov",
            options={"lr": 1 / L, "beta": (sk - 1) / (sk + 1), "maxiter": T, "gtol": 0.0},
        )
        assert np.linalg.norm(nag.x) <= (T + 1) * (1 - 1 / sk) ** T * e0 + 1e-300
    if cond == 100:  # and heavy ball is far ahead of gradient descent's bound
        gd_rate = (cond - 1) / (cond + 1)
        assert np.linalg.norm(hb.x) < 1e-3 * gd_rate**T * e0


# ----------------------------------------------------------------------------- C


def _ls(n, d, seed=0):
    rng = np.random.default_rng(seed)
    return LeastSquares(rng.standard_normal((n, d)), rng.standard_normal(n))


@pytest.mark.parametrize(("n", "d"), [(200, 20), (500, 50), (100, 10)])
def test_default_minimize_is_at_least_as_fast_as_gd(n, d):
    """The default method of minimize (no method, numerator or lr) reaches gtol 1e-8 on
    least squares in at most GD's iterations, GD at lr = 1/L counted here."""
    prob = _ls(n, d)
    x0 = np.zeros(d)
    x, gd_nit = x0.copy(), 0
    while np.max(np.abs(prob.grad(x))) > 1e-8:
        x = x - prob.grad(x) / prob.L
        gd_nit += 1
    res = amopt.minimize(prob, x0, options={"gtol": 1e-8, "maxiter": 10 * gd_nit})
    assert res.success, res.message
    assert res.nit <= gd_nit
    np.testing.assert_allclose(res.x, prob.x_star, rtol=0, atol=1e-6)


def test_the_papers_exact_rule_is_one_option_away():
    prob = _ls(200, 20)
    opts = {"lr": 1 / prob.L, "maxiter": 5, "gtol": 0.0}
    # the paper's Algorithm 1 (lam = 0, beta_max = 1, exact numerator): tests/oracle.py
    ref = run_am_mgd(
        lambda xs, t: (float(prob.fun(xs[0])), [prob.grad(xs[0])]),
        [np.zeros(20)], lr=1 / prob.L, n_steps=5, numerator="exact",
    )["betas"]  # fmt: skip
    res = amopt.minimize(
        prob, np.zeros(20), method="am-mgd", options={**opts, "numerator": "exact"}
    )
    np.testing.assert_allclose(res.betas, ref, rtol=1e-9, atol=1e-12)
    lin = amopt.minimize(prob, np.zeros(20), method="am-mgd", options=opts)
    assert not np.allclose(lin.betas[2:], ref[2:])


# ----------------------------------------------------------------------------- H


def test_fun_and_jac_that_modify_their_argument_do_not_change_the_run():
    q = _q100()
    opts = {"lr": 1 / q.L, "maxiter": 30, "gtol": 0.0}
    ref = amopt.minimize(q.fun, np.ones(10), jac=q.grad, method="heavy-ball", options=opts)

    def fun(x):
        f = q.fun(x)
        x *= np.nan  # a careless user function
        return f

    def jac(x):
        g = q.grad(x)
        x[:] = 0.0
        return g

    res = amopt.minimize(fun, np.ones(10), jac=jac, method="heavy-ball", options=opts)
    np.testing.assert_array_equal(res.x, ref.x)
    assert res.status == ref.status == 1


def test_torch_x0_that_requires_grad_builds_no_history():
    torch = pytest.importorskip("torch")
    q = _q100()
    A = torch.tensor(q.A)
    x0 = torch.ones(10, dtype=torch.float64, requires_grad=True)
    seen = []

    def fun(x):
        seen.append(x.requires_grad)
        return 0.5 * x @ (A @ x)

    res = amopt.minimize(
        fun, x0, jac=lambda x: A @ x, method="gd", options={"lr": 1 / q.L, "maxiter": 5}
    )
    assert not any(seen)  # fun sees detached iterates: nothing to record
    assert not res.x.requires_grad and res.x.grad_fn is None
    assert not res.jac.requires_grad
    assert x0.requires_grad and torch.equal(x0.detach(), torch.ones(10, dtype=torch.float64))


@pytest.mark.parametrize("form", ["xk", "intermediate_result"])
def test_scipy_method_passes_every_callback_form(form):
    import scipy.optimize

    q = _q100()
    got = []
    if form == "xk":

        def callback(xk):
            got.append(xk)
            if len(got) == 3:
                raise StopIteration

    else:

        def callback(intermediate_result):
            got.append(intermediate_result)
            if len(got) == 3:
                raise StopIteration

    res = scipy.optimize.minimize(
        q.fun,
        np.ones(10),
        jac=q.grad,
        callback=callback,
        method=amopt.scipy_method("gd"),
        options={"lr": 1 / q.L},
    )
    assert res.status == 99 and res.nit == 3
    if form == "xk":  # as scipy's own methods: the iterate, an array
        assert all(type(x) is np.ndarray and x.shape == (10,) for x in got)
    else:
        assert all(isinstance(r, scipy.optimize.OptimizeResult) for r in got)
        assert [r.nit for r in got] == [1, 2, 3]
    ref = scipy.optimize.minimize(
        q.fun,
        np.ones(10),
        jac=q.grad,
        method="BFGS",
        callback=callback if form == "xk" else None,
        options={"maxiter": 1},
    )
    assert type(got[-1] if form == "xk" else got[-1].x) is type(ref.x)


def test_counters_as_scipy_counts_them():
    q = _q100()
    calls = {"fun": 0, "jac": 0}

    def fun(x):
        calls["fun"] += 1
        return float(q.fun(x))

    def jac(x):
        calls["jac"] += 1
        return q.grad(x)

    opts = {"lr": 1 / q.L, "maxiter": 7, "gtol": 0.0}
    res = amopt.minimize(fun, np.ones(10), jac=jac, method="gd", options=opts)
    assert (res.nfev, res.njev, res.nit) == (calls["fun"], calls["jac"], 7)
    # finite differences: every call of fun counted in nfev, each gradient in njev
    calls["fun"] = 0
    with pytest.warns(OptimizeWarning):
        res = amopt.minimize(fun, np.ones(10), method="gd", options=opts)
    assert res.nfev == calls["fun"] == 8 * 11 and res.njev == 8 and res.nit == 7
