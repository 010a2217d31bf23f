"""Step-by-step agreement of ``amopt.minimize`` (and so of the core) with the oracle.

Every method of ``minimize`` is run with ``gtol=0`` for a fixed number of steps
and each iterate (collected by the callback) and each applied beta is compared
with ``tests/oracle.py``, the literal NumPy transcription of algorithms.md,
at 1e-12 relative tolerance in float64.
"""

import itertools

import array_api_compat.numpy as npx
import numpy as np
import pytest

import amopt

from _objectives import Logistic, Quadratic, logreg_data, quadratic_data
from oracle import run_adam, run_am_adam, run_am_mgd, run_gd, run_mgd

N_STEPS = 40
RTOL = 1e-12


def _problem(kind):
    if kind.startswith("quadratic"):
        A, b = quadratic_data()
        split = kind.endswith("list")
        prob = Quadratic(npx, A, b, split=split)
        x0 = [np.zeros((3, 2)), np.ones(6)] if split else np.zeros(12)
        return prob, x0, 1.0 / prob.L
    X, y = logreg_data()
    as_list = kind.endswith("list")
    prob = Logistic(npx, X, y, as_list=as_list)
    x0 = [np.full(8, 0.1), np.zeros(1)] if as_list else np.full(8, 0.1)
    return prob, x0, 1.0 / prob.L


PROBLEMS = ["quadratic", "quadratic-list", "logistic", "logistic-list"]


def _as_list(x):
    return [np.asarray(a) for a in x] if isinstance(x, list | tuple) else [np.asarray(x)]


def _oracle_fn(prob, x0):
    listy = isinstance(x0, list)

    def oracle(x_list, t):
        x = [np.array(a) for a in x_list] if listy else np.array(x_list[0])
        return float(prob(x)), _as_list(prob.grad(x))

    return oracle


def _run(prob, x0, method, options):
    iterates = [_as_list(x0)]
    betas = []

    def callback(intermediate_result):
        iterates.append([np.array(a) for a in _as_list(intermediate_result.x)])

    res = amopt.minimize(
        prob,
        x0,
        method=method,
        jac=getattr(prob, "grad", None),
        callback=callback,
        options={"maxiter": N_STEPS, "gtol": 0.0, **options},
    )
    assert res.nit == N_STEPS and len(iterates) == N_STEPS + 1
    betas = res.get("betas")
    return iterates, betas, res


def _assert_trajectories(got, want):
    assert len(got) == len(want)
    for t, (xg, xw) in enumerate(zip(got, want, strict=True)):
        for a, b in zip(xg, xw, strict=True):
            scale = max(1.0, float(np.max(np.abs(b))))
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * scale, err_msg=f"step {t}")


def _assert_betas(got, want, x0, numerator, cond=None):
    if not isinstance(x0, list) and want.ndim == 2:
        want = want[:, 0]
        cond = None if cond is None else cond[:, 0]
    # The exact numerator divides the rounding error of f_prev - f by lr * |d - g|^2;
    # near convergence that amplifies ~1e-16 to ~1e-10 in beta (the iterates still
    # agree to 1e-12 because d - g is then tiny).
    atol = 1e-12 if numerator == "linear" else 1e-9
    if cond is not None:
        # |change of beta| <= delta * cond (tests/oracle.py, _adam_beta_condition) for
        # input errors of delta times the inputs' scale. The two runs form g, d, x, p with
        # different operation orders (SIMD widths, fused kernels) and every step's
        # rounding is carried into d, v and x by the later steps: delta grows to about
        # N_STEPS * eps. A one-element scope with a tiny gradient or with d close to g
        # has a large cond, which is why one fixed tolerance held on one CPU only.
        delta = N_STEPS * np.finfo(np.float64).eps
        atol = np.maximum(atol, 4 * delta * np.where(np.isfinite(cond), cond, 0.0))
    bound = atol + 1e-10 * np.abs(want)
    np.testing.assert_array_less(np.abs(np.asarray(got) - want), bound, err_msg="beta")


@pytest.mark.parametrize("kind", PROBLEMS)
@pytest.mark.parametrize(
    ("method", "oracle_run", "options"),
    [
        ("gd", run_gd, {}),
        ("gd", run_gd, {"weight_decay": 0.05}),
        ("mgd", run_mgd, {"beta": 0.9}),
        ("mgd", run_mgd, {"beta": 0.5, "weight_decay": 0.05}),
    ],
)
def test_baselines_match_oracle(kind, method, oracle_run, options):
    prob, x0, lr = _problem(kind)
    got, _, res = _run(prob, x0, method, {"lr": lr, **options})
    want = oracle_run(_oracle_fn(prob, x0), _as_list(x0), lr=lr, n_steps=N_STEPS, **options)
    _assert_trajectories(got, want["x"])
    assert "betas" not in res


@pytest.mark.parametrize("kind", PROBLEMS)
@pytest.mark.parametrize(
    ("method", "decoupled", "wd"),
    [("adam", False, 0.0), ("adam", False, 0.05), ("adamw", True, 0.0), ("adamw", True, 0.05)],
)
def test_adam_matches_oracle(kind, method, decoupled, wd):
    prob, x0, _ = _problem(kind)
    opts = {"lr": 0.05, "betas": (0.8, 0.99), "eps": 1e-8, "weight_decay": wd}
    got, _, _ = _run(prob, x0, method, opts)
    want = run_adam(
        _oracle_fn(prob, x0), _as_list(x0), n_steps=N_STEPS, decoupled=decoupled, **opts
    )
    _assert_trajectories(got, want["x"])


AM_GRID = list(
    itertools.product([0.0, 0.1], ["exact", "linear"], [None, "clip", "restart"], [False, True])
)


@pytest.mark.parametrize("kind", PROBLEMS)
@pytest.mark.parametrize(("lam", "numerator", "variant", "per_layer"), AM_GRID)
def test_am_mgd_matches_oracle(kind, lam, numerator, variant, per_layer):
    prob, x0, lr = _problem(kind)
    opts = {
        "lr": lr,
        "lam": lam,
        "numerator": numerator,
        "variant": variant,
        "per_layer": per_layer,
        "beta_max": 0.95 if lam else 1.0,
        "beta_min": 0.3,
    }
    got, betas, _ = _run(prob, x0, "am-mgd", opts)
    want = run_am_mgd(_oracle_fn(prob, x0), _as_list(x0), n_steps=N_STEPS, **opts)
    _assert_trajectories(got, want["x"])
    _assert_betas(betas, want["betas"], x0, numerator)
    # the run is not trivial: beta actually adapts
    assert np.ptp(betas) > 0.05


@pytest.mark.parametrize("kind", PROBLEMS)
@pytest.mark.parametrize(
    ("method", "mode", "wd"),
    [
        ("am-adam", "l2", 0.0),
        ("am-adam", "l2", 0.05),
        ("am-adamw", "decoupled", 0.05),
        ("am-adamw", "proximal", 0.05),
    ],
)
@pytest.mark.parametrize(
    ("lam", "numerator", "variant", "per_layer"),
    [
        (0.0, "linear", None, True),
        (0.1, "linear", None, False),
        (0.1, "exact", None, True),
        (0.0, "exact", "clip", False),
        (0.1, "linear", "restart", True),
        (0.1, "exact", "clip", True),
    ],
)
def test_am_adam_matches_oracle(kind, method, mode, wd, lam, numerator, variant, per_layer):
    prob, x0, _ = _problem(kind)
    opts = {
        "lr": 0.05,
        "betas": (0.9, 0.99),
        "eps": 1e-8,
        "weight_decay": wd,
        "lam": lam,
        "numerator": numerator,
        "variant": variant,
        "per_layer": per_layer,
    }
    if method == "am-adamw":
        opts["weight_decay_mode"] = mode
    got, betas, _ = _run(prob, x0, method, opts)
    oracle_opts = {k: v for k, v in opts.items() if k != "weight_decay_mode"}
    want = run_am_adam(
        _oracle_fn(prob, x0), _as_list(x0), n_steps=N_STEPS, weight_decay_mode=mode, **oracle_opts
    )
    _assert_trajectories(got, want["x"])
    _assert_betas(betas, want["betas"], x0, numerator, want["beta_cond"])


class _Recording:
    """Wraps a FiniteSum and records the mini-batch indices minimize asks for."""

    def __init__(self, inner):
        self.inner, self.n_samples, self.batches = inner, inner.n_samples, []

    def value_and_grad(self, x):
        return self.inner.value_and_grad(x)

    def batch_value_and_grad(self, x, idx):
        self.batches.append(np.array(idx))
        return self.inner.batch_value_and_grad(x, idx)


@pytest.mark.parametrize("kind", ["logistic", "logistic-list"])
@pytest.mark.parametrize(
    ("method", "options"),
    [
        ("sgd", {}),
        ("msgd", {"beta": 0.9}),
        ("am-sgd", {}),
        ("am-sgd", {"lam": 0.0, "beta_max": 1.0, "numerator": "exact", "per_layer": True}),
        ("am-sgd", {"variant": "restart", "weight_decay": 0.01}),
        ("adam", {"lr": 0.05}),
        ("am-adamw", {"lr": 0.05}),
    ],
)
@pytest.mark.parametrize("replace", [False, True])
def test_stochastic_methods_match_oracle(kind, method, options, replace):
    prob, x0, lr = _problem(kind)
    rec = _Recording(prob)
    opts = {"lr": lr, "batch_size": 7, "seed": 3, "replace": replace, **options}
    got, betas, res = _run(rec, x0, method, opts)
    assert len(rec.batches) == N_STEPS
    listy = isinstance(x0, list)

    def oracle(x_list, t):
        x = [np.array(a) for a in x_list] if listy else np.array(x_list[0])
        f, g = prob.batch_value_and_grad(x, rec.batches[t])
        return float(f), _as_list(g)

    o = {k: v for k, v in opts.items() if k not in ("batch_size", "seed", "replace")}
    if method == "sgd":
        want = run_gd(oracle, _as_list(x0), n_steps=N_STEPS, **o)
    elif method == "msgd":
        want = run_mgd(oracle, _as_list(x0), n_steps=N_STEPS, **o)
    elif method == "am-sgd":
        o = {"lam": 0.1, "beta_max": 0.9, "numerator": "linear", **o}
        want = run_am_mgd(oracle, _as_list(x0), n_steps=N_STEPS, **o)
    elif method == "adam":
        want = run_adam(oracle, _as_list(x0), n_steps=N_STEPS, **o)
    else:
        want = run_am_adam(oracle, _as_list(x0), n_steps=N_STEPS, weight_decay=0.01, **o)
    _assert_trajectories(got, want["x"])
    # the result reports the full objective at the final iterate
    f_full = prob(res.x)
    assert res.fun == pytest.approx(float(f_full), rel=1e-14)
    assert res.status == 1 and not res.success and res.nit == N_STEPS  # scipy's maxiter


def test_sampling_without_replacement_is_random_reshuffling():
    X, y = logreg_data(n=20)
    rec = _Recording(Logistic(npx, X, y))
    amopt.minimize(
        rec,
        np.zeros(8),
        method="sgd",
        options={"lr": 0.1, "batch_size": 6, "maxiter": 12, "seed": 0},
    )
    # 20 samples, batches of 6: epochs are [6, 6, 6, 2]
    sizes = [b.size for b in rec.batches]
    assert sizes == [6, 6, 6, 2] * 3
    for e in range(3):
        epoch = np.concatenate(rec.batches[4 * e : 4 * e + 4])
        np.testing.assert_array_equal(np.sort(epoch), np.arange(20))


def test_same_seed_same_trajectory_different_seed_differs():
    X, y = logreg_data()
    prob = Logistic(npx, X, y)
    runs = [
        amopt.minimize(
            prob,
            np.zeros(8),
            method="am-sgd",
            options={"lr": 0.5, "batch_size": 5, "maxiter": 30, "seed": s},
        )
        for s in (7, 7, 8)
    ]
    np.testing.assert_array_equal(runs[0].x, runs[1].x)
    np.testing.assert_array_equal(runs[0].betas, runs[1].betas)
    assert np.max(np.abs(runs[0].x - runs[2].x)) > 1e-6
