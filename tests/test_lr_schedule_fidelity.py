"""The paper's AM under learning-rate schedules and on zero first gradients.

``docs/algorithms.md``: the linearised numerators estimate ``f(x_{t-1}) - f(x_t)`` with
the previous step's learning rate, so under a schedule they carry ``r = lr_{t-1} / lr_t``
(section 2 step 3, section 3 step 4); on a scope's first step a vanishing AM-Adam
denominator (a gradient that is exactly zero) gives ``beta1_max`` (section 3 step 5).
Every surface is compared here step by step with ``tests/oracle.py``, which writes both
rules in their general form, independently of ``amopt``.
"""

from types import SimpleNamespace

import numpy as np
import pytest

import amopt
from amopt import _rule
from amopt._config import AMConfig

from oracle import run_am_adam, run_am_mgd


def _zero_first_problem():
    """Two arrays; the second's gradient is exactly zero at x0 and nonzero afterwards
    (``b - a**2`` with ``b0 = a0**2``: a layer no loss reaches on the first step)."""
    target = np.linspace(-1.0, 1.5, 5)

    def fun(xs):
        a, b = xs
        return 0.5 * float(np.sum((a - target) ** 2) + np.sum((b - a**2) ** 2))

    def grad(xs):
        a, b = (np.asarray(x, dtype=np.float64) for x in xs)
        r = b - a**2
        return [a - target - 2.0 * a * r, r]

    a0 = np.linspace(0.2, 0.6, 5)
    return fun, grad, [a0, a0**2]


def _oracle(fun, grad):
    def oracle(xs, t):
        return fun(xs), grad(xs)

    return oracle


# --------------------------------------------------------------------------- the rules


def test_momentum_rule_ratio_is_the_general_numerator():
    """``momentum_beta`` with ``lr_ratio`` equals ``(1+lam) r <g,d> - <v, g+lam d>`` over
    ``<v,v>``, formed here from the vectors; at ``r = 1`` it is today's rule bit for bit."""
    rng = np.random.default_rng(0)
    # a cap far above the ratio: the raw ratio is compared (AMConfig caps at 1)
    cfg = SimpleNamespace(lam=0.1, beta_max=10.0, variant=None)
    for _ in range(20):
        g, d = rng.standard_normal(7), rng.standard_normal(7)
        v = d - g
        sums = np.array([v @ v, g @ g, d @ d])
        for r in (0.5, 0.9, 1.3):
            want = ((1 + 0.1) * r * (g @ d) - v @ (g + 0.1 * d)) / (v @ v)
            want = min(max(want, 0.0), 10.0)
            beta, _ = _rule.momentum_beta(np, sums, cfg, lr_ratio=np.float64(r))
            np.testing.assert_allclose(float(beta), want, rtol=1e-12, atol=1e-13)
        plain = _rule.momentum_beta(np, sums, cfg)
        assert _rule.momentum_beta(np, sums, cfg, lr_ratio=1.0)[0] == plain[0]
        assert _rule.momentum_beta(np, sums, cfg, lr_ratio=np.float64(1.0))[0] == plain[0]


def test_adam_weights_ratio_is_the_general_numerator():
    """The weighted terms with ``lr_ratio`` sum to section 3's general N."""
    rng = np.random.default_rng(1)
    lam, wd, lr, r = 0.1, 0.05, 0.02, 0.7
    cfg = AMConfig.cached(lam=lam, beta_max=0.9, numerator="linear")
    g, d, x = (rng.standard_normal(9) for _ in range(3))
    p = rng.uniform(0.5, 2.0, 9)
    u, w = 1 / (1 + lam * p), 1 / (1 + lam * p) / p
    terms = [g * g / p, u * (d - g) ** 2, g * d / p, g * x, d * x]
    weights = _rule.adam_weights(cfg, lr=lr, weight_decay=wd, lr_ratio=r)
    got = sum(a * t.sum() for a, t in zip(weights, terms, strict=True))
    want = np.sum(
        r * (1 + wd * lr) * (g * d / p + wd * g * x)
        - w * (d - g) * (g + lam * p * d)
        - wd * x * (d - g)
    )
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert _rule.adam_weights(cfg, lr=lr, weight_decay=wd, lr_ratio=1.0) == _rule.adam_weights(
        cfg, lr=lr, weight_decay=wd
    )


def test_adam_rule_first_step_with_zero_gradient_keeps_beta1_max():
    cfg = AMConfig.cached(lam=0.1, beta_max=0.9, numerator="linear")
    zero = np.zeros((2, 3))
    first = np.array([1.0, 0.0])
    np.testing.assert_array_equal(_rule.adam_beta(np, zero, cfg, first=first), [0.9, 0.0])
    assert float(_rule.adam_beta(np, zero[0], cfg, first=True)) == 0.9
    assert float(_rule.adam_beta(np, zero[0], cfg, first=False)) == 0.0
    clip = AMConfig.cached(lam=0.1, beta_max=0.9, numerator="linear", variant="clip")
    assert float(_rule.adam_beta(np, zero[0], clip, first=True)) == 0.9


def test_lr_ratio_edge_cases():
    assert _rule.lr_ratio(None, 0.1) == 1.0  # no previous step
    assert _rule.lr_ratio(0.1, 0.0) == 1.0  # lr_t = 0
    assert _rule.lr_ratio(0.1, 0.05) == 2.0


# --------------------------------------------------------------------------- minimize


@pytest.mark.parametrize("method", ["am-adam", "am-adamw"])
@pytest.mark.parametrize("per_layer", [True, False])
def test_minimize_adam_zero_first_gradient_matches_oracle(method, per_layer):
    """A zero gradient on the first step keeps Adam's first bias correction: the
    iterates and betas follow the oracle (today's beta = 0 sets beta1_prod to 0 and the
    second array's next updates are about 5x too small)."""
    fun, grad, x0 = _zero_first_problem()
    n = 30
    opts = {"lr": 0.05, "betas": (0.9, 0.999), "eps": 1e-8, "lam": 0.1, "per_layer": per_layer}
    wd = 0.01 if method == "am-adamw" else 0.0
    iterates = [[a.copy() for a in x0]]

    def callback(intermediate_result):
        iterates.append([np.array(a) for a in intermediate_result.x])

    res = amopt.minimize(
        fun,
        [a.copy() for a in x0],
        jac=grad,
        method=method,
        callback=callback,
        options={"maxiter": n, "gtol": 0.0, "weight_decay": wd, **opts},
    )
    mode = "decoupled" if method == "am-adamw" else "l2"
    want = run_am_adam(
        _oracle(fun, grad),
        x0,
        n_steps=n,
        weight_decay=wd,
        weight_decay_mode=mode,
        **{k: v for k, v in opts.items()},
    )
    betas = np.asarray(res.betas)
    if per_layer:
        assert want["betas"][0, 1] == 0.9  # the zero-gradient layer's first beta
        np.testing.assert_allclose(betas, want["betas"], rtol=1e-10, atol=1e-12)
    for t, (got, ref) in enumerate(zip(iterates, want["x"], strict=True)):
        for a, b in zip(got, ref, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13, err_msg=f"step {t}")
