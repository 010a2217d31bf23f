"""The paper's AM under learning-rate schedules and on zero first gradients.

``docs/algorithms.md``: the linearised numerators estimate ``f(x_{t-1}) - f(x_t)`` with
the previous step's learning rate, so under a schedule they carry ``r = lr_{t-1} / lr_t``
(section 2 step 3, section 3 step 4); on a scope's first step a vanishing AM-Adam
denominator (a gradient that is exactly zero) gives ``beta1_max`` (section 3 step 5).
Every surface is compared here step by step with ``tests/oracle.py``, which writes both
rules in their general form, independently of ``amopt``.
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest

import amopt
from amopt.core import rule as _rule
from amopt.core.config import AMConfig

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


# --------------------------------------------------------------------------- torch


torch = pytest.importorskip("torch")

from amopt.torch import AMSGD, AMAdam, AMAdamW  # noqa: E402

N_STEPS = 30


BATCH = 8


def _data():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((BATCH * N_STEPS, 3))
    Y = np.tanh(X @ rng.standard_normal((3, 4))) + 0.3 * rng.standard_normal((BATCH * N_STEPS, 4))
    W0 = 0.5 * rng.standard_normal((4, 3))
    b0 = np.zeros(4)  # a zero-initialised bias: a nonzero first gradient all the same
    return X, Y, [W0, b0]


def _batch(t):
    """The rows of step t's mini-batch (mini-batch gradients: betas inside (0, cap))."""
    return slice(BATCH * t, BATCH * (t + 1))


def _np_oracle(X, Y):
    """f and its gradient (a one-layer tanh network, squared error) in NumPy."""

    def oracle(xs, t):
        W, b = xs
        X_, Y_ = X[_batch(t)], Y[_batch(t)]
        h = np.tanh(X_ @ W.T + b)
        r = h - Y_
        n = X_.shape[0]
        f = 0.5 * float(np.sum(r * r)) / n
        dz = r * (1 - h * h) / n
        return f, [dz.T @ X_, dz.sum(0)]

    return oracle


def _schedule(k):
    """Warm-up from 20% over 8 steps, then a cosine decay to 10% (a factor of the base lr)."""
    if k < 8:
        return 0.2 + 0.8 * k / 8
    frac = (k - 8) / (N_STEPS - 8)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))  # a Python float, as lr is


def _torch_run(cls, kwargs, *, compiled=False, n_steps=N_STEPS, split=None, dtype=None):
    """Steps of ``cls`` under the schedule; the iterates, betas and lrs of every step."""
    X, Y, x0 = _data()
    dtype = torch.float64 if dtype is None else dtype
    Xt, Yt = torch.tensor(X, dtype=dtype), torch.tensor(Y, dtype=dtype)
    params = [torch.nn.Parameter(torch.tensor(a, dtype=dtype)) for a in x0]
    opt = cls(params, **kwargs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule)
    iterates, betas, lrs = [], [], []

    def step():
        opt.step()

    step_fn = torch.compile(step, backend="eager") if compiled else step
    for k in range(n_steps):
        if split is not None and k == split:  # resume from a checkpoint here
            state = {"opt": opt.state_dict(), "sched": sched.state_dict()}
            params = [torch.nn.Parameter(p.detach().clone()) for p in params]
            opt = cls(params, **kwargs)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule)
            opt.load_state_dict(state["opt"])
            sched.load_state_dict(state["sched"])
        opt.zero_grad()
        W, b = params
        X_, Y_ = Xt[_batch(k)], Yt[_batch(k)]
        h = torch.tanh(X_ @ W.T + b)
        loss = 0.5 * ((h - Y_) ** 2).sum() / X_.shape[0]
        loss.backward()
        lrs.append(opt.param_groups[0]["lr"])
        step_fn()
        sched.step()
        iterates.append([p.detach().double().numpy().copy() for p in params])
        betas.append([float(b) for b in opt.latest_betas()[0]])
    return iterates, np.array(betas), lrs


PATHS = {
    "single": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
    "default": {},
}


def _assert_inside(betas, cap):
    """Enough betas strictly inside (0, cap), where r changes them (a clipped one hides it)."""
    inside = (betas > 0.01) & (betas < cap - 0.01)
    assert inside.sum() >= 5, betas


def _assert_matches(iterates, betas, want, per_layer, rtol=1e-10):
    want_betas = want["betas"] if per_layer else want["betas"][:, None]
    np.testing.assert_allclose(
        betas, np.broadcast_to(want_betas, betas.shape), rtol=rtol, atol=1e-12
    )
    for k, (got, ref) in enumerate(zip(iterates, want["x"][1:], strict=True)):
        for a, b in zip(got, ref, strict=True):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-12, err_msg=f"step {k}")


@pytest.mark.parametrize("per_layer", [False, True], ids=["global", "per-layer"])
@pytest.mark.parametrize("path", list(PATHS))
def test_amsgd_under_a_schedule_matches_oracle(path, per_layer):
    kwargs = {"lr": 1.0, "lam": 0.1, "beta_max": 0.9, "per_layer": per_layer, **PATHS[path]}
    iterates, betas, lrs = _torch_run(AMSGD, kwargs)
    X, Y, x0 = _data()
    want = run_am_mgd(
        _np_oracle(X, Y), x0, lr=lrs, n_steps=N_STEPS, lam=0.1, beta_max=0.9,
        numerator="linear", per_layer=per_layer,
    )  # fmt: skip
    _assert_inside(want["betas"], 0.9)
    _assert_matches(iterates, betas, want, per_layer)


@pytest.mark.parametrize("per_layer", [False, True], ids=["global", "per-layer"])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("cls", [AMAdamW, AMAdam])
def test_am_adam_under_a_schedule_matches_oracle(cls, path, per_layer):
    wd = 0.05
    kwargs = {"lr": 0.2, "lam": 0.1, "weight_decay": wd, "per_layer": per_layer, **PATHS[path]}
    iterates, betas, lrs = _torch_run(cls, kwargs)
    X, Y, x0 = _data()
    mode = "decoupled" if cls is AMAdamW else "l2"
    want = run_am_adam(
        _np_oracle(X, Y), x0, lr=lrs, n_steps=N_STEPS, lam=0.1, weight_decay=wd,
        weight_decay_mode=mode, per_layer=per_layer,
    )  # fmt: skip
    _assert_inside(want["betas"], 0.9)
    _assert_matches(iterates, betas, want, per_layer)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("cls", [AMSGD, AMAdamW])
def test_float32_under_a_schedule_follows_the_oracle(cls, path):
    """float32 parameters under the schedule: the float64 oracle's betas and iterates to
    float32's accuracy over a few steps (the rounding of each step is carried by the next,
    and a beta near a clip point may move by more than the inputs: 8 steps, 1e-3)."""
    lr = 1.0 if cls is AMSGD else 0.2
    kwargs = {"lr": lr, "lam": 0.1, "per_layer": True, **PATHS[path]}
    n = 8
    iterates, betas, lrs = _torch_run(cls, kwargs, n_steps=n, dtype=torch.float32)
    X, Y, x0 = _data()
    if cls is AMSGD:
        want = run_am_mgd(
            _np_oracle(X, Y), [a.astype(np.float32) for a in x0], lr=lrs, n_steps=n,
            lam=0.1, beta_max=0.9, numerator="linear", per_layer=True,
        )  # fmt: skip
    else:
        want = run_am_adam(
            _np_oracle(X, Y), [a.astype(np.float32) for a in x0], lr=lrs, n_steps=n,
            lam=0.1, weight_decay=0.01, per_layer=True,
        )  # fmt: skip
    np.testing.assert_allclose(betas, want["betas"], atol=1e-3)
    for got, ref in zip(iterates, want["x"][1:], strict=True):
        for a, b in zip(got, ref, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("path", ["single", "foreach", "default"])
@pytest.mark.parametrize("cls", [AMSGD, AMAdamW])
def test_compiled_step_under_a_schedule_matches_oracle(cls, path):
    """``torch.compile(opt.step)``: a float lr that changes recompiles (as for torch's
    optimizers), and every graph takes this step's r from the ``prev_lr`` state tensor."""
    kwargs = {"lr": 1.0 if cls is AMSGD else 0.2, "lam": 0.1, "per_layer": True, **PATHS[path]}
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=64, accumulated_recompile_limit=256):
        iterates, betas, lrs = _torch_run(cls, kwargs, compiled=True)
    torch._dynamo.reset()
    X, Y, x0 = _data()
    if cls is AMSGD:
        want = run_am_mgd(
            _np_oracle(X, Y), x0, lr=lrs, n_steps=N_STEPS, lam=0.1, beta_max=0.9,
            numerator="linear", per_layer=True,
        )  # fmt: skip
    else:
        want = run_am_adam(
            _np_oracle(X, Y), x0, lr=lrs, n_steps=N_STEPS, lam=0.1, weight_decay=0.01,
            per_layer=True,
        )  # fmt: skip
    _assert_matches(iterates, betas, want, True)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("cls", [AMSGD, AMAdamW])
def test_resume_mid_schedule_is_bit_identical(cls, path):
    """``state_dict()`` carries the previous lr: a run resumed from a checkpoint in the
    middle of the warm-up gives the uninterrupted run's iterates bit for bit."""
    kwargs = {"lr": 0.5 if cls is AMSGD else 0.1, "lam": 0.1, "per_layer": False, **PATHS[path]}
    whole, whole_betas, _ = _torch_run(cls, kwargs, n_steps=12)
    resumed, resumed_betas, _ = _torch_run(cls, kwargs, n_steps=12, split=5)
    np.testing.assert_array_equal(resumed_betas, whole_betas)
    for a, b in zip(resumed, whole, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("cls", [AMSGD, AMAdamW])
def test_state_dict_without_prev_lr_loads_with_ratio_one(cls):
    """A state dict saved before the previous lr was kept (no ``"prev_lr"``) loads; its
    next step takes r = 1, as one whose previous lr equals the current one."""
    kwargs = {"lr": 0.1, "lam": 0.1}
    iterates, _, _ = _torch_run(cls, kwargs, n_steps=3)
    X, Y, _ = _data()
    states = []
    for keep in (False, True):
        params = [torch.nn.Parameter(torch.tensor(a)) for a in iterates[-1]]
        opt = cls(params, **kwargs)
        W, b = params
        (
            0.5 * ((torch.tanh(torch.tensor(X[:8]) @ W.T + b) - torch.tensor(Y[:8])) ** 2).sum()
        ).backward()
        opt.step()
        state = opt.state_dict()
        state["param_groups"][0]["lr"] = 0.05  # the schedule moved on
        for entry in state["state"].values():
            if keep:  # as a checkpoint of today: the previous lr, equal to the new one
                entry["prev_lr"] = 0.05
            else:  # as an old checkpoint
                del entry["prev_lr"]
        opt2 = cls([torch.nn.Parameter(p.detach().clone()) for p in params], **kwargs)
        opt2.load_state_dict(state)
        W2, b2 = opt2.param_groups[0]["params"]
        loss = 0.5 * ((torch.tanh(torch.tensor(X[8:16]) @ W2.T + b2) - torch.tensor(Y[8:16])) ** 2)
        loss.sum().backward()
        opt2.step()
        assert all(opt2.state[p]["prev_lr"] == 0.05 for p in opt2.param_groups[0]["params"])
        states.append([p.detach().clone() for p in opt2.param_groups[0]["params"]])
    for a, b in zip(*states, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _zero_layer_data():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((BATCH * N_STEPS, 3))
    Y = rng.standard_normal((BATCH * N_STEPS, 2))
    return X, Y, [0.5 * rng.standard_normal((5, 3)), np.zeros((2, 5))]


def _zero_layer_oracle(X, Y):
    """A two-layer tanh network whose output layer starts at zero: the first layer's
    gradient is exactly zero on the first step."""

    def oracle(xs, t):
        W, V = xs
        X_, Y_ = X[_batch(t)], Y[_batch(t)]
        h = np.tanh(X_ @ W.T)
        r = h @ V.T - Y_
        n = X_.shape[0]
        dh = (r @ V) / n
        return 0.5 * float(np.sum(r * r)) / n, [(dh * (1 - h * h)).T @ X_, r.T @ h / n]

    return oracle


def _zero_layer_run(cls, kwargs, n_steps):
    """``cls`` on the zero-output-layer network: the iterates, the betas of every step
    and the optimizer; the first layer's first gradient is checked to be exactly 0."""
    X, Y, x0 = _zero_layer_data()
    params = [torch.nn.Parameter(torch.tensor(a)) for a in x0]
    opt = cls(params, lr=0.01, lam=0.1, weight_decay=0.01, **kwargs)
    Xt, Yt = torch.tensor(X), torch.tensor(Y)
    got, betas = [], []
    for k in range(n_steps):
        opt.zero_grad()
        W, V = params
        out = torch.tanh(Xt[_batch(k)] @ W.T) @ V.T
        (0.5 * ((out - Yt[_batch(k)]) ** 2).sum() / BATCH).backward()
        if k == 0:
            assert float(W.grad.abs().max()) == 0.0
        opt.step()
        got.append([p.detach().numpy().copy() for p in params])
        betas.append([float(b) for b in opt.latest_betas()[0]])
    mode = "decoupled" if cls is AMAdamW else "l2"
    want = run_am_adam(
        _zero_layer_oracle(X, Y), x0, lr=0.01, n_steps=n_steps, lam=0.1, weight_decay=0.01,
        weight_decay_mode=mode, per_layer=True,
    )  # fmt: skip
    return got, np.array(betas), want, opt


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("cls", [AMAdamW, AMAdam])
def test_zero_first_gradient_keeps_the_bias_correction(cls, path):
    """A layer whose first gradient is exactly zero (behind a zero-initialised output
    layer): its first beta is beta1_max, so beta1_prod keeps Adam's bias correction,
    and every path follows the oracle (before, beta = 0 made its updates ~5x smaller)."""
    got, betas, want, opt = _zero_layer_run(cls, PATHS[path], 10)
    assert want["betas"][0, 0] == 0.9
    assert float(opt.state[opt.param_groups[0]["params"][0]]["beta1_prod"]) > 0
    _assert_matches(got, betas, want, True)


@pytest.mark.parametrize("per_layer", [False, True], ids=["global", "per-layer"])
@pytest.mark.parametrize("cls", [AMSGD, AMAdamW])
def test_triton_path_under_a_schedule_matches_oracle(triton_interpreter, cls, per_layer):
    """The Triton driver (its first step, then its planned steps), the rule kernel with r a
    fourth input generated from the rule's tape."""
    lr = 1.0 if cls is AMSGD else 0.2
    kwargs = {"lr": lr, "lam": 0.1, "per_layer": per_layer}
    iterates, betas, lrs = _torch_run(cls, kwargs, n_steps=16)
    X, Y, x0 = _data()
    if cls is AMSGD:
        want = run_am_mgd(
            _np_oracle(X, Y), x0, lr=lrs, n_steps=16, lam=0.1, beta_max=0.9,
            numerator="linear", per_layer=per_layer,
        )  # fmt: skip
    else:
        want = run_am_adam(
            _np_oracle(X, Y), x0, lr=lrs, n_steps=16, lam=0.1, weight_decay=0.01,
            per_layer=per_layer,
        )  # fmt: skip
    _assert_matches(iterates, betas, want, per_layer)


def test_triton_path_zero_first_gradient(triton_interpreter):
    got, betas, want, _ = _zero_layer_run(AMAdamW, {}, 4)
    assert betas[0][0] == 0.9
    _assert_matches(got, betas, want, True)
