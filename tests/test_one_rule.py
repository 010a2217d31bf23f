"""The beta rules exist once: replacing them in ``amopt.core.rule`` changes every surface.

Each rule function is swapped (monkeypatch) for one that returns a marker value of
beta that no real rule would produce on these problems; then every surface must
report (and apply) the marker: ``minimize`` on NumPy, torch and array-api-strict, the
stochastic methods, the torch optimizers in every path and the bench cases. A surface
with a private copy of the rule would keep its own beta and fail here.
"""

from __future__ import annotations

import array_api_strict
import numpy as np
import pytest
import torch

import amopt
from amopt.bench import cases
from amopt.core import rule as _rule
from amopt.torch import AMSGD, AMAdam, AMAdamW

MARK = 0.3125  # exactly representable in every float type


def _marked_momentum(xp, sums, cfg, *, lr=None, f_decrease=None, lr_ratio=None):
    beta = xp.zeros_like(sums[..., 0]) + MARK
    return beta, (beta + cfg.lam) / (1.0 + cfg.lam)


def _marked_adam(xp, sums, cfg, *, lr=None, weight_decay=0.0, f_decrease=None, first=None):
    return xp.zeros_like(sums[..., 0]) + MARK


@pytest.fixture
def marked(monkeypatch):
    monkeypatch.setattr(_rule, "momentum_beta", _marked_momentum)
    monkeypatch.setattr(_rule, "adam_beta", _marked_adam)


def _quadratic(xp):
    diag = xp.asarray([1.0, 4.0, 10.0], dtype=xp.float64)
    b = xp.asarray([1.0, -2.0, 0.5], dtype=xp.float64)

    def fun(x):
        return 0.5 * xp.sum(diag * x * x) - xp.sum(b * x)

    def jac(x):
        return diag * x - b

    return fun, jac


def _all_marked(betas) -> bool:
    arr = np.asarray([float(b) for b in np.ravel(np.asarray(betas, dtype=object))])
    return arr.size > 0 and bool(np.all(arr == MARK))


@pytest.mark.parametrize("namespace", ["numpy", "torch", "array_api_strict"])
@pytest.mark.parametrize("method", ["am-mgd", "am-adam", "am-adamw"])
def test_minimize_uses_the_rule(marked, namespace, method):
    xp = {"numpy": np, "torch": torch, "array_api_strict": array_api_strict}[namespace]
    fun, jac = _quadratic(xp)
    x0 = xp.zeros(3, dtype=xp.float64)
    res = amopt.minimize(fun, x0, jac=jac, method=method, options={"lr": 0.05, "maxiter": 4})
    assert _all_marked(res.betas)


@pytest.mark.parametrize("numerator", ["exact", "linear"])
def test_minimize_takes_a_replaced_rule_after_running_the_original(monkeypatch, numerator):
    """No surface keeps the rule it ran last: the same call, rule replaced in between."""
    fun, jac = _quadratic(np)
    options = {"lr": 0.05, "maxiter": 4, "numerator": numerator}
    first = amopt.minimize(fun, np.zeros(3), jac=jac, method="am-mgd", options=options)
    assert not _all_marked(first.betas)
    monkeypatch.setattr(_rule, "momentum_beta", _marked_momentum)
    res = amopt.minimize(fun, np.zeros(3), jac=jac, method="am-mgd", options=options)
    assert _all_marked(res.betas)


def test_minimize_parameter_list_uses_the_rule(marked):
    x0 = [np.zeros(3), np.zeros((2, 2))]

    def fun(xs):
        return float(np.sum(xs[0] ** 2) + np.sum((xs[1] - 1) ** 2))

    def jac(xs):
        return [2 * xs[0] + 1, 2 * (xs[1] - 1)]

    res = amopt.minimize(
        fun, x0, jac=jac, method="am-mgd", options={"lr": 0.1, "maxiter": 3, "per_layer": True}
    )
    assert _all_marked(res.betas)


def test_stochastic_methods_use_the_rule(marked):
    from amopt.problems import LeastSquares

    rng = np.random.default_rng(0)
    prob = LeastSquares(rng.standard_normal((40, 3)), rng.standard_normal(40))
    for method in ("am-sgd", "am-adamw"):
        res = amopt.minimize(
            prob,
            np.zeros(3),
            method=method,
            options={"lr": 0.01, "maxiter": 3, "batch_size": 8, "seed": 0},
        )
        assert _all_marked(res.betas), method


def test_core_building_blocks_use_the_rule(marked):
    g, d = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    assert float(amopt.am_beta(g, d)) == MARK
    assert float(amopt.am_adam_beta(g, d, 0 * g, 1 + 0 * g, lr=0.1)) == MARK
    x = np.ones(40000)  # above the NumPy fast path's block size
    _, _, beta = amopt.am_momentum_step(x, x, amopt.am_momentum_init(x), lr=0.1)
    assert float(beta) == MARK


def _torch_params(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    params = [
        torch.nn.Parameter(torch.randn(4, 3, generator=gen, dtype=dtype)),
        torch.nn.Parameter(torch.randn(3, generator=gen, dtype=dtype)),
    ]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen, dtype=dtype)
    return params


PATHS = [{"foreach": False}, {"foreach": True}, {"fused": True}]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("path", PATHS, ids=["single", "foreach", "fused"])
@pytest.mark.parametrize("per_layer", [True, False])
@pytest.mark.parametrize("cls", [AMSGD, AMAdamW, AMAdam])
def test_torch_optimizers_use_the_rule(marked, cls, per_layer, path):
    params = _torch_params()
    opt = cls(params, lr=0.01, per_layer=per_layer, **path)
    for _ in range(2):
        opt.step()
    assert _all_marked([b for group in opt.latest_betas() for b in group])


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_bench_cases_use_the_rule(marked):
    for kind in ("am_adamw_fused", "am_adamw_foreach", "amsgd_fused", "amsgd_foreach"):
        case = cases.OptimizerCase(kind, 1000, 3)
        case.run()
        betas = [b for group in case.optimizer.latest_betas() for b in group]
        assert _all_marked(betas), kind
    core = cases.CoreStepCase("am-mgd", 100)
    _, _, beta = core._step()
    assert float(beta) == MARK


@pytest.mark.parametrize("variant", [None, "clip", "restart"])
def test_host_rule_on_scalars_is_the_rule_on_arrays(variant):
    """The device loop runs one scope's rule on NumPy scalars
    (``amopt.optimize.split._HostScalars``): the same values, bit for bit, as the rule on a
    NumPy array of that scope, over ordinary, degenerate (tiny ``<v,v>``), overflowing (inf,
    NaN) and signed sums, for both families and both numerators."""
    from amopt.core.config import AMConfig
    from amopt.optimize import split as _split

    rng = np.random.default_rng(0)
    rows = list(np.exp(rng.normal(0.0, 3.0, size=(200, 5))) * rng.choice([-1.0, 1.0], (200, 5)))
    rows += [
        np.array([1e-40, 1.0, 1.0, 0.5, 0.5]),  # degenerate <v,v>
        np.array([0.0, 0.0, 0.0, 0.0, 0.0]),
        np.array([np.inf, np.inf, np.inf, 1.0, 1.0]),  # overflowing sums: NaN ratio
        np.array([np.nan, 1.0, 2.0, 0.0, 0.0]),
        np.array([2.0, 1.0, 3.0, -1.0, 1.0]),
    ]
    config = AMConfig(lam=0.1, beta_max=0.9, variant=variant, beta_min=0.2, theta=0.5)
    cases_ = [
        (_rule.momentum_beta, 3, {}),
        (_rule.momentum_beta, 5, {"lr": 0.1, "f_decrease": 0.03}),
        (_rule.adam_beta, 3, {"lr": 0.1, "weight_decay": 0.01}),
        (_rule.adam_beta, 3, {"lr": 0.1, "weight_decay": 0.01, "f_decrease": -0.2}),
    ]
    for rule, k, kwargs in cases_:
        for row in rows:
            sums = [float(v) for v in row[:k]]
            got = _split._host_rule(rule, sums, k, config, **kwargs)
            with np.errstate(all="ignore"):
                want = rule(np, np.asarray(sums).reshape(1, k), config, **kwargs)
            got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
            for a, b in zip(got, want, strict=True):
                assert a.shape == b.shape == (1,) and a.dtype == b.dtype == np.float64
                np.testing.assert_array_equal(a, b, strict=True)
