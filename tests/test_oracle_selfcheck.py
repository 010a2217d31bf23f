"""Sanity checks of the test oracle itself (``tests/oracle.py``), not of amopt."""

import numpy as np
import pytest

from oracle import (
    am_beta,
    run_adam,
    run_am_adam,
    run_am_mgd,
    run_gd,
    run_mgd,
    tiny,
)

SHAPES = [(3, 4), (5,), (2, 1, 3)]


def _problem(seed=0):
    """A small float64 least-squares problem over three arrays, with mini-batches."""
    rng = np.random.default_rng(seed)
    A = [rng.standard_normal((8, int(np.prod(s)))) for s in SHAPES]
    b = rng.standard_normal(8)
    x0 = [rng.standard_normal(s) for s in SHAPES]

    def oracle(x, t):
        rows = np.arange(8) if t < 0 else np.array([t % 8, (t + 3) % 8, (t + 5) % 8])
        r = sum(A[i][rows] @ x[i].ravel() for i in range(len(x))) - b[rows]
        f = 0.5 * float(r @ r) / len(rows)
        g = [(A[i][rows].T @ r / len(rows)).reshape(SHAPES[i]) for i in range(len(x))]
        return f, g

    return oracle, x0


def _assert_lists_close(a, b, rtol=1e-13, atol=0.0):
    assert len(a) == len(b)
    for ai, bi in zip(a, b, strict=True):
        np.testing.assert_allclose(ai, bi, rtol=rtol, atol=atol)


@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_run_adam_matches_torch(decoupled, weight_decay):
    torch = pytest.importorskip("torch")
    oracle, x0 = _problem()
    lr, betas, eps, n_steps = 1e-2, (0.9, 0.999), 1e-8, 20
    ref = run_adam(
        oracle,
        x0,
        lr=lr,
        n_steps=n_steps,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        decoupled=decoupled,
    )

    params = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in x0]
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = cls(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False)
    for t in range(n_steps):
        _, g = oracle([p.detach().numpy().copy() for p in params], t)
        for p, gi in zip(params, g, strict=True):
            p.grad = torch.from_numpy(gi)
        opt.step()
        _assert_lists_close([p.detach().numpy() for p in params], ref["x"][t + 1])
    exp_avg = [opt.state[p]["exp_avg"].numpy() for p in params]
    _assert_lists_close(exp_avg, ref["d"])


def test_mgd_with_zero_beta_is_gd():
    oracle, x0 = _problem()
    gd = run_gd(oracle, x0, lr=0.05, n_steps=10, weight_decay=0.01)
    mgd = run_mgd(oracle, x0, lr=0.05, beta=0.0, n_steps=10, weight_decay=0.01)
    for a, b in zip(gd["x"], mgd["x"], strict=True):
        _assert_lists_close(a, b, rtol=0.0)


def test_am_mgd_step0_is_gradient_step():
    oracle, x0 = _problem()
    lr = 0.05
    for lam in (0.0, 0.3):
        for numerator in ("exact", "linear"):
            res = run_am_mgd(oracle, x0, lr=lr, n_steps=1, lam=lam, numerator=numerator)
            _, g = oracle(x0, 0)
            _assert_lists_close(res["x"][1], [x0[i] - lr * g[i] for i in range(len(x0))])
            _assert_lists_close(res["d"], g, rtol=0.0)
            assert res["betas"].shape == (1,)
            assert res["betas"][0] == 0.0


def test_am_mgd_betas_shapes_and_variants():
    oracle, x0 = _problem()
    kw = {"lr": 0.05, "n_steps": 6, "numerator": "linear", "lam": 0.1, "beta_max": 0.9}
    glob = run_am_mgd(oracle, x0, **kw)
    layer = run_am_mgd(oracle, x0, per_layer=True, **kw)
    assert glob["betas"].shape == (6,)
    assert layer["betas"].shape == (6, len(x0))
    assert np.all((glob["betas"] >= 0) & (glob["betas"] <= 0.9))
    restart = run_am_mgd(oracle, x0, variant="restart", **kw)
    assert set(restart["betas"].tolist()) <= {0.1, 0.9}
    clip = run_am_mgd(oracle, x0, variant="clip", beta_min=0.5, **kw)
    assert np.all(clip["betas"] >= 0.5)
    assert len(glob["x"]) == 7


def test_am_beta_guard_never_nan():
    assert am_beta(0.0, 0.0, 0.0, 0.0, 1.0) == 0.0
    assert am_beta(3.0, 0.0, 2.0, 2.0, 1.0) == 0.0
    assert am_beta(1.0, 1e-40, 1.0, 1.0, 1.0) == 0.0
    assert am_beta(0.25, 1.0, 1.0, 1.0, 1.0) == 0.25
    assert am_beta(5.0, 1.0, 1.0, 1.0, 0.9) == 0.9
    assert am_beta(-5.0, 1.0, 1.0, 1.0, 0.9) == 0.0
    assert tiny == np.finfo(np.float64).eps ** 2


def test_lam_only_moves_clipping_bounds():
    rng = np.random.default_rng(1)
    lam, beta_max = 0.3, 0.9
    lo, hi = lam / (1 + lam), (beta_max + lam) / (1 + lam)
    seen = set()
    for k in range(300):
        g = rng.standard_normal(7)
        d = rng.standard_normal(7) * 10.0 ** rng.uniform(-1, 1) + (k % 3) * g
        den = float(np.sum((d - g) ** 2))
        gg = float(g @ g)
        beta_0 = gg / den
        beta = am_beta((1 + lam) * gg - lam * den, den, float(d @ d), gg, beta_max)
        gamma = (beta + lam) / (1 + lam)
        assert gamma == pytest.approx(np.clip(beta_0, lo, hi), rel=1e-13)
        seen.add(0 if beta_0 < lo else (2 if beta_0 > hi else 1))
    # both bounds and the interior were exercised
    assert seen == {0, 1, 2}


def test_am_mgd_step_from_given_d0_uses_lam_clip_fact():
    oracle, x0 = _problem()
    rng = np.random.default_rng(2)
    d0 = [rng.standard_normal(s) for s in SHAPES]
    lam, beta_max, lr = 0.2, 0.8, 0.05
    res = run_am_mgd(
        oracle, x0, lr=lr, n_steps=1, lam=lam, beta_max=beta_max, numerator="exact", d0=d0
    )
    _, g = oracle(x0, 0)
    gg = sum(float(np.sum(gi * gi)) for gi in g)
    den = sum(float(np.sum((di - gi) ** 2)) for di, gi in zip(d0, g, strict=True))
    gamma = float(np.clip(gg / den, lam / (1 + lam), (beta_max + lam) / (1 + lam)))
    expected_d = [gi + gamma * (di - gi) for di, gi in zip(d0, g, strict=True)]
    _assert_lists_close(res["d"], expected_d, rtol=1e-12, atol=1e-15)
    _assert_lists_close(res["x"][1], [x0[i] - lr * expected_d[i] for i in range(len(x0))])


@pytest.mark.parametrize("per_layer", [False, True])
def test_am_adam_first_step_is_scaled_adam_step(per_layer):
    oracle, x0 = _problem()
    lr, betas, eps, lam = 1e-2, (0.9, 0.999), 1e-8, 0.7
    adam = run_adam(oracle, x0, lr=lr, n_steps=1, betas=betas, eps=eps)
    am = run_am_adam(
        oracle, x0, lr=lr, n_steps=1, betas=betas, eps=eps, lam=lam, per_layer=per_layer
    )
    _, g = oracle(x0, 0)
    # at t = 1: v_hat = g*g, c = 1 - beta1_max
    p = [(1 - betas[0]) * (eps + np.abs(gi)) for gi in g]
    for i in range(len(x0)):
        adam_step = adam["x"][1][i] - x0[i]
        am_step = am["x"][1][i] - x0[i]
        np.testing.assert_allclose(am_step, adam_step / (1 + lam * p[i]), rtol=1e-12)
    assert np.all(am["betas"] == betas[0])


def test_am_adam_fused_numerator_identity():
    rng = np.random.default_rng(3)
    for _ in range(20):
        g, d, x = rng.standard_normal((3, 11))
        p = rng.uniform(0.01, 2.0, 11)
        lam, wd, lr = rng.uniform(0, 1), rng.uniform(0, 0.5), rng.uniform(1e-3, 1.0)
        u = 1 / (1 + lam * p)
        w = u / p
        fused = np.sum(
            g * g / p
            - lam * u * (d - g) ** 2
            + wd * lr * g * d / p
            + wd * (2 + wd * lr) * g * x
            - wd * d * x
        )
        paper = (
            (1 + wd * lr) * (np.sum(g * d / p) + wd * np.sum(g * x))
            - np.sum(w * (d - g) * (g + lam * p * d))
            - wd * np.sum(x * (d - g))
        )
        scale = np.sum(np.abs(g * g / p)) + np.sum(np.abs(d * d / p)) + np.sum(x * x)
        assert abs(fused - paper) <= 1e-13 * scale


def test_am_mgd_exact_equals_linear_when_f_drop_is_linear():
    # An oracle whose value drop is exactly <g_t, x_{t-1} - x_t> = lr <g_t, d_t> makes
    # the exact numerator equal the linearised one (section 2, step 3).
    rng = np.random.default_rng(4)
    grads = [[rng.standard_normal(s) for s in SHAPES] for _ in range(8)]
    memory = {}

    def oracle(x, t):
        g = grads[t]
        if t == 0:
            f = 1.0
        else:
            f = memory["f"] - sum(
                float(np.sum(gi * (xp - xi))) for gi, xp, xi in zip(g, memory["x"], x, strict=True)
            )
        memory["f"], memory["x"] = f, [a.copy() for a in x]
        return f, [a.copy() for a in g]

    x0 = [np.zeros(s) for s in SHAPES]
    kw = {"lr": 0.1, "n_steps": 8, "lam": 0.25, "beta_max": 0.95}
    lin = run_am_mgd(oracle, x0, numerator="linear", **kw)
    memory.clear()
    ex = run_am_mgd(oracle, x0, numerator="exact", **kw)
    np.testing.assert_allclose(ex["betas"], lin["betas"], rtol=1e-9, atol=1e-12)
    assert np.any((lin["betas"] > 0) & (lin["betas"] < 0.95))


def test_am_adam_exact_uses_linear_numerator_on_step_1():
    oracle, x0 = _problem()
    kw = {"lr": 1e-2, "n_steps": 5, "lam": 0.1, "per_layer": False}
    lin = run_am_adam(oracle, x0, numerator="linear", **kw)
    ex = run_am_adam(oracle, x0, numerator="exact", **kw)
    assert lin["betas"].shape == (5,)
    assert lin["betas"][0] == ex["betas"][0]
    _assert_lists_close(lin["x"][1], ex["x"][1], rtol=0.0)
    assert not np.array_equal(lin["betas"], ex["betas"])


@pytest.mark.parametrize("mode", ["decoupled", "proximal", "l2"])
def test_am_adam_weight_decay_modes_run(mode):
    oracle, x0 = _problem()
    res = run_am_adam(
        oracle,
        x0,
        lr=1e-2,
        n_steps=5,
        weight_decay=0.1,
        weight_decay_mode=mode,
        variant="restart",
    )
    assert res["betas"].shape == (5, len(x0))
    assert set(res["betas"].ravel().tolist()) <= {0.1, 0.9}
    assert all(np.all(np.isfinite(a)) for xs in res["x"] for a in xs)
