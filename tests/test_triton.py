"""The Triton kernels of the AM optimizers against the single-tensor path, step by step.

Without a GPU the kernels run on CPU tensors in Triton's interpreter
(``TRITON_INTERPRET=1``, set here for this module only: the kernels are compiled
when first called and use none of ``triton.language``'s own jit functions, so the
variable only has to be set by then, wherever triton was imported first). With a CUDA
device they run compiled, on the GPU. Chunks and tiles are made small so that
tensors of a few dozen elements span several programs, whole and partial.

Three references:

* the optimizers' single-tensor path (``foreach=False``), run side by side;
* a float64 step written here from ``docs/algorithms.md`` (sections 2 and 3),
  which also gives the conditioning of the sums that sets the tolerances of the
  float32 and half-precision checks;
* exact identities (a skipped step changes nothing; scaling the gradients by a
  power of two and unscaling them inside the kernels changes nothing).
"""

from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")  # the only reason to skip: CI installs triton

from amopt.backends.torch import rule as _torch_rule  # noqa: E402
from amopt.core import rule as _rule  # noqa: E402
from amopt.core.config import AMConfig  # noqa: E402
from amopt.torch import AMSGD, AMAdam, AMAdamW  # noqa: E402
from amopt.torch import _triton as tri  # noqa: E402
from amopt.torch._records import (  # noqa: E402
    AdamHyper,
    AdamTensors,
    Scaler,
    SGDHyper,
    SGDTensors,
)

INTERPRET = not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in (
    "",
    "0",
)
DEVICE = "cpu" if INTERPRET else "cuda"
# whole chunks, partial chunks, one element and an empty tensor (skipped by the kernels)
SHAPES = [(37,), (1,), (0,), (64,), (5, 29)]
LAM = 0.1


@pytest.fixture(autouse=True, scope="module")
def _small_chunks_and_interpreter():
    with pytest.MonkeyPatch.context() as mp:
        if INTERPRET:
            mp.setenv("TRITON_INTERPRET", "1")
        mp.setattr(tri, "BLOCK", 16)
        mp.setattr(tri, "CHUNK", 32)
        mp.setattr(tri, "SEGMENT_ROWS", 4)
        yield


def _tensors(shapes, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=torch.float64).to(DEVICE, dtype) for s in shapes]


def _grad_sequence(shapes, n_steps, dtype, seed, noise=0.3):
    """Gradients ``s_t base + noise`` with signs ``s = 1, -1, 1, 1, ...``.

    The reversal makes momentum harmful for a step, so the betas land inside
    (0, beta_max), not only at a clip. ``|base| >= 0.5 > |noise|`` keeps every
    ``exp_avg_sq`` in float16's normal range: the single-tensor path computes the
    preconditioner in the parameter dtype, where a subnormal ``v`` loses its digits.
    """
    base = [b.sign() * (0.5 + b.abs()) for b in _tensors(shapes, torch.float64, seed)]
    signs = [1.0, -1.0] + [1.0] * max(n_steps - 2, 0)
    return [
        [
            (s * b + noise * e.clamp(-1.0, 1.0)).to(dtype)
            for b, e in zip(base, _tensors(shapes, torch.float64, seed + 1 + t), strict=True)
        ]
        for t, s in enumerate(signs[:n_steps])
    ]


def _eps(dtype):
    return torch.finfo(dtype).eps


def _subnormal(dtype):
    """The spacing of the dtype's subnormals: the absolute rounding error floor of a store."""
    return torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps


# --------------------------------------------------------------------------- float64 oracle


def _scopes(n, per_layer):
    return [[i] for i in range(n)] if per_layer else [list(range(n))]


def _guarded(num, den, ref, beta_max):
    if den <= _eps(torch.float64) ** 2 * ref or math.isnan(num / den):
        return 0.0
    return min(max(num / den, 0.0), beta_max)


def sgd_oracle(x, g, d, *, lr, beta_max, wd, maximize, per_layer):
    """AM-MSGD step (algorithms.md section 2) in float64; ``d[i] is None``: first step."""
    x = [t.double() for t in x]
    g = [(-t.double() if maximize else t.double()) + wd * xi for t, xi in zip(g, x, strict=True)]
    d = [gi if di is None else di.double() for gi, di in zip(g, d, strict=True)]
    n = len(x)
    beta, kappa, d_new, x_new = [0.0] * n, [1.0] * n, [None] * n, [None] * n
    for scope in _scopes(n, per_layer):
        vv = sum(float(((d[i] - g[i]) ** 2).sum()) for i in scope)
        gg = sum(float((g[i] ** 2).sum()) for i in scope)
        dd = sum(float((d[i] ** 2).sum()) for i in scope)
        num = (1 + LAM) * gg - LAM * vv
        b = _guarded(num, vv, dd + gg, beta_max)
        k = ((1 + LAM) * gg + LAM * vv) / abs(num) if num else math.inf
        gamma = (b + LAM) / (1 + LAM)
        for i in scope:
            beta[i], kappa[i] = b, k
            d_new[i] = g[i] + gamma * (d[i] - g[i])
            x_new[i] = x[i] - lr * d_new[i]
    # d_new changes with beta as (d - g) / (1 + lam), x_new as -lr times that
    dbeta = [(d[i] - g[i]).abs() / (1 + LAM) for i in range(n)]
    return {"x": x_new, "d": d_new, "beta": beta, "kappa": kappa, "dd_dbeta": dbeta}


def adam_oracle(
    x, g, d, v, steps, prods, *, lr, beta1, beta2, eps, wd, mode, maximize, per_layer,
    force_beta=None,
):  # fmt: skip
    """AM-Adam(W) step (algorithms.md section 3) in float64; ``prods[i]``: the scope's product.

    ``force_beta`` replaces the rule's beta (the bias correction still uses ``beta1``)."""
    x = [t.double() for t in x]
    g = [-t.double() if maximize else t.double() for t in g]
    if mode == "l2":
        g = [gi + wd * xi for gi, xi in zip(g, x, strict=True)]
        wd = 0.0
    d = [t.double() for t in d]
    n = len(x)
    v = [beta2 * vi.double() + (1 - beta2) * gi * gi for vi, gi in zip(v, g, strict=True)]
    out = {k: [None] * n for k in ("x", "d", "v", "dd_dbeta", "dx_dbeta")}
    out.update(beta=[0.0] * n, kappa=[1.0] * n, prod=[0.0] * n, p=[None] * n)
    for scope in _scopes(n, per_layer):
        c = 1 - beta1 * float(prods[scope[0]])
        num = absnum = den = ref = 0.0
        for i in scope:
            bias2 = 1 - beta2 ** (float(steps[i]) + 1)
            p = c * (eps + torch.sqrt(v[i] / bias2))
            u = 1 / (1 + LAM * p)
            w = u / p
            terms = [
                g[i] * g[i] / p,
                -LAM * u * (d[i] - g[i]) ** 2,
                wd * lr * g[i] * d[i] / p,
                wd * (2 + wd * lr) * g[i] * x[i],
                -wd * d[i] * x[i],
            ]
            num += float(sum(t.sum() for t in terms))
            absnum += float(sum(t.abs().sum() for t in terms))
            den += float((w * (d[i] - g[i]) ** 2).sum())
            ref += float((w * d[i] ** 2).sum() + (w * g[i] ** 2).sum())
            out["p"][i] = p
        b = _guarded(num, den, ref, beta1) if force_beta is None else force_beta
        for i in scope:
            p = out["p"][i]
            coef = (b + LAM * p) / (1 + LAM * p)
            dn = g[i] + coef * (d[i] - g[i])
            if mode == "proximal":
                xn = (x[i] - lr * dn / p) / (1 + lr * wd)
            else:
                xn = (1 - lr * wd) * x[i] - lr * dn / p
            out["x"][i], out["d"][i], out["v"][i] = xn, dn, v[i]
            out["beta"][i], out["prod"][i] = b, float(prods[scope[0]]) * b
            out["kappa"][i] = absnum / abs(num) if num else math.inf
            out["dd_dbeta"][i] = (d[i] - g[i]).abs() / (1 + LAM * p)
            out["dx_dbeta"][i] = lr * out["dd_dbeta"][i] / p
    return out


# --------------------------------------------------------------------------- runners


def _config(beta_max, per_layer):
    return AMConfig(lam=LAM, beta_max=beta_max, per_layer=per_layer, numerator="linear")


def _sgd(params, grads, bufs, steps, *, config, grad_scale=None, found_inf=None, **hyper):
    """``triton_amsgd`` called with the optimizers' keywords."""
    t = SGDTensors(params, grads, bufs, steps)
    return tri.triton_amsgd(t, SGDHyper(config=config, **hyper), Scaler(grad_scale, found_inf))


def _adam(params, grads, d, v, steps, prods, *, config, grad_scale=None, found_inf=None, **hyper):
    """``triton_am_adamw`` called with the optimizers' keywords."""
    t = AdamTensors(params, grads, d, v, steps, prods)
    h = AdamHyper(config=config, **hyper)
    return tri.triton_am_adamw(t, h, Scaler(grad_scale, found_inf))


class TritonSGD:
    """The functional driver with its own state lists."""

    def __init__(self, xs, *, lr=0.05, beta_max=0.9, wd=0.0, maximize=False, per_layer=False):
        self.x = [t.clone() for t in xs]
        self.d = [None] * len(xs)
        self.steps = [torch.zeros(()) for _ in xs]
        self.kw = dict(lr=lr, weight_decay=wd, maximize=maximize)
        self.config = _config(beta_max, per_layer)

    def step(self, grads, **scaler):
        grads = [g.clone() for g in grads]
        return _sgd(self.x, grads, self.d, self.steps, config=self.config, **self.kw, **scaler)


class TritonAdam:
    def __init__(
        self, xs, *, lr=0.02, beta1=0.9, beta2=0.99, eps=1e-8, wd=0.1, mode="decoupled",
        maximize=False, per_layer=True,
    ):  # fmt: skip
        self.x = [t.clone() for t in xs]
        self.d = [torch.zeros_like(t) for t in xs]
        self.v = [torch.zeros_like(t) for t in xs]
        self.steps = [torch.zeros(()) for _ in xs]
        acc = torch.float64 if xs[0].dtype == torch.float64 else torch.float32
        self.prods = [torch.ones((), dtype=acc, device=DEVICE) for _ in xs]
        self.kw = dict(
            lr=lr, beta2=beta2, eps=eps, weight_decay=wd,
            weight_decay_mode=mode, maximize=maximize,
        )  # fmt: skip
        self.config = _config(beta1, per_layer)

    def step(self, grads, **scaler):
        grads = [g.clone() for g in grads]
        betas, self.prods = _adam(
            self.x, grads, self.d, self.v, self.steps, self.prods, config=self.config,
            **self.kw, **scaler,
        )  # fmt: skip
        return betas


class Reference:
    """An AM optimizer on the single-tensor path (``foreach=False``)."""

    def __init__(self, cls, xs, **hyper):
        self.params = [torch.nn.Parameter(t.clone()) for t in xs]
        self.opt = cls(self.params, foreach=False, **hyper)

    def step(self, grads):
        for p, g in zip(self.params, grads, strict=True):
            p.grad = g.clone()
        self.opt.step()
        return [self.opt.state[p]["beta"] for p in self.params]

    @property
    def x(self):
        return [p.detach() for p in self.params]

    def state(self, key):
        return [self.opt.state[p].get(key) for p in self.params]


def _ref_sgd(xs, *, lr=0.05, beta_max=0.9, wd=0.0, maximize=False, per_layer=False):
    return Reference(
        AMSGD, xs, lr=lr, lam=LAM, beta_max=beta_max, weight_decay=wd, per_layer=per_layer,
        maximize=maximize,
    )  # fmt: skip


def _ref_adam(
    xs, *, lr=0.02, beta1=0.9, beta2=0.99, eps=1e-8, wd=0.1, mode="decoupled",
    maximize=False, per_layer=True,
):  # fmt: skip
    if mode == "l2":
        cls, extra = AMAdam, {}
    else:
        cls, extra = AMAdamW, {"weight_decay_mode": mode}
    return Reference(
        cls, xs, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd, lam=LAM,
        per_layer=per_layer, maximize=maximize, **extra,
    )  # fmt: skip


def _assert_close(actual, expected, atol, what):
    """``|actual - expected| <= atol`` elementwise; ``atol`` a number or one tensor per entry."""
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        err = (a.double().cpu() - e.double().cpu()).flatten()
        tol = atol[i].double().cpu().flatten() if isinstance(atol, list) else torch.tensor(atol)
        tol = tol.expand_as(err)
        bad = int((err.abs() - tol).argmax()) if err.numel() else 0
        assert bool((err.abs() <= tol).all()), (
            f"{what}[{i}]: error {float(err[bad]):.3g} > {float(tol[bad]):.3g} at {bad}"
        )


def _betas(betas):
    return [float(b) for b in betas]


# --------------------------------------------------------------------------- float64


@pytest.mark.parametrize("per_layer", [False, True], ids=["global", "per-layer"])
@pytest.mark.parametrize(
    "wd, maximize", [(0.0, False), (0.05, True)], ids=["plain", "decay-maximize"]
)
def test_amsgd_float64_matches_single_tensor(per_layer, wd, maximize):
    xs = _tensors(SHAPES, torch.float64, 0)
    hyper = dict(wd=wd, maximize=maximize, per_layer=per_layer)
    tr, ref = TritonSGD(xs, **hyper), _ref_sgd(xs, **hyper)
    interior = 0
    for grads in _grad_sequence(SHAPES, 4, torch.float64, 1):
        bt, br = tr.step(grads), ref.step(grads)
        # float64 sums of a few hundred terms in another order: tens of ulps at most
        assert _betas(bt) == pytest.approx(_betas(br), rel=64 * _eps(torch.float64), abs=1e-15)
        _assert_close(tr.x, ref.x, 64 * _eps(torch.float64), "x")
        _assert_close(tr.d, ref.state("momentum_buffer"), 64 * _eps(torch.float64), "d")
        interior += sum(0.0 < b < 0.9 for b in _betas(bt))
    assert [float(s) for s in tr.steps] == [4.0] * len(SHAPES)
    assert interior > 0


@pytest.mark.parametrize("per_layer", [True, False], ids=["per-layer", "global"])
@pytest.mark.parametrize("mode", ["decoupled", "proximal", "l2"])
def test_am_adamw_float64_matches_single_tensor(mode, per_layer):
    xs = _tensors(SHAPES, torch.float64, 0)
    hyper = dict(mode=mode, per_layer=per_layer, maximize=mode == "proximal")
    tr, ref = TritonAdam(xs, **hyper), _ref_adam(xs, **hyper)
    interior = 0
    for grads in _grad_sequence(SHAPES, 4, torch.float64, 2):
        bt, br = tr.step(grads), ref.step(grads)
        assert _betas(bt) == pytest.approx(_betas(br), rel=1e-12, abs=1e-14)
        _assert_close(tr.x, ref.x, 1e-13, "x")
        _assert_close(tr.d, ref.state("exp_avg"), 1e-13, "exp_avg")
        _assert_close(tr.v, ref.state("exp_avg_sq"), 1e-15, "exp_avg_sq")
        _assert_close(tr.prods, ref.state("beta1_prod"), 1e-13, "beta1_prod")
        interior += sum(0.0 < b < 0.9 for b in _betas(bt))
    assert interior > 0


# --------------------------------------------------------------------------- low precision


def _sgd_state(ref):
    return [t.clone() if t is not None else None for t in ref.state("momentum_buffer")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_layer", [False, True], ids=["global", "per-layer"])
def test_amsgd_low_precision_step_by_step(dtype, per_layer):
    """Each step from the reference's state: the kernels against the float64 oracle and the
    reference, with tolerances from the dtype's eps and the conditioning of the sums."""
    eps, floor = _eps(dtype), _subnormal(dtype)
    lr, wd = 0.05, 0.01
    xs = _tensors(SHAPES, dtype, 3)
    ref = _ref_sgd(xs, wd=wd, per_layer=per_layer)
    for grads in _grad_sequence(SHAPES, 3, dtype, 4):
        x0, d0 = [t.clone() for t in ref.x], _sgd_state(ref)
        tr = TritonSGD(x0, wd=wd, per_layer=per_layer)
        tr.d = [t.clone() if t is not None else None for t in d0]
        tr.steps = [torch.full((), 0.0 if t is None else 1.0) for t in d0]
        bt = tr.step(grads)
        br = ref.step(grads)
        want = sgd_oracle(x0, grads, d0, lr=lr, beta_max=0.9, wd=wd, maximize=False,
                          per_layer=per_layer)  # fmt: skip
        # the kernels compute in float32 from the stored values; the reference in the dtype
        for side, (betas, x, d, arith) in {
            "triton": (bt, tr.x, tr.d, _eps(torch.float32)),
            "reference": (br, ref.x, ref.state("momentum_buffer"), eps),
        }.items():
            # each sum carries a relative error of a few units of the arithmetic, amplified by
            # the conditioning kappa of the numerator; d and x are then rounded to the dtype
            beta_tol = [8 * arith * (1 + k) for k in want["kappa"]]
            for i, (b, w) in enumerate(zip(_betas(betas), want["beta"], strict=True)):
                assert abs(b - w) <= beta_tol[i], f"{side}: beta[{i}] {b} vs {w}"
            d_tol = [
                4 * (eps * (w.abs() + s) + floor) + tol * s
                for w, s, tol in zip(want["d"], want["dd_dbeta"], beta_tol, strict=True)
            ]
            _assert_close(d, want["d"], d_tol, f"{side} d")
            x_tol = [
                4 * (eps * (xw.abs() + lr * dw.abs()) + floor) + lr * dt
                for xw, dw, dt in zip(want["x"], want["d"], d_tol, strict=True)
            ]
            _assert_close(x, want["x"], x_tol, f"{side} x")
        assert all(t.dtype == dtype for t in tr.d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_layer", [True, False], ids=["per-layer", "global"])
def test_am_adamw_low_precision_step_by_step(dtype, per_layer):
    eps_t, floor = _eps(dtype), _subnormal(dtype)
    hyper = dict(lr=0.02, beta1=0.9, beta2=0.99, eps=1e-6, wd=0.1, per_layer=per_layer)
    xs = _tensors(SHAPES, dtype, 5)
    ref = _ref_adam(xs, **hyper)
    for grads in _grad_sequence(SHAPES, 3, dtype, 6):
        pre = {
            "x": [t.clone() for t in ref.x],
            "d": [t.clone() for t in ref.state("exp_avg")] if ref.state("step")[0] is not None
            else [torch.zeros_like(t) for t in xs],
            "v": [t.clone() for t in ref.state("exp_avg_sq")] if ref.state("step")[0] is not None
            else [torch.zeros_like(t) for t in xs],
            "steps": [torch.zeros(()) if s is None else s.clone() for s in ref.state("step")],
            "prods": [torch.ones((), device=DEVICE) if p is None else p.clone()
                      for p in ref.state("beta1_prod")],
        }  # fmt: skip
        tr = TritonAdam(pre["x"], **hyper)
        tr.d, tr.v = [t.clone() for t in pre["d"]], [t.clone() for t in pre["v"]]
        tr.steps, tr.prods = [s.clone() for s in pre["steps"]], [p.clone() for p in pre["prods"]]
        bt = tr.step(grads)
        br = ref.step(grads)
        want = adam_oracle(
            pre["x"], grads, pre["d"], pre["v"], pre["steps"], pre["prods"], lr=0.02, beta1=0.9,
            beta2=0.99, eps=1e-6, wd=0.1, mode="decoupled", maximize=False, per_layer=per_layer,
        )  # fmt: skip
        for side, (betas, x, d, v, arith, c) in {
            "triton": (bt, tr.x, tr.d, tr.v, _eps(torch.float32), 4),
            # the reference rounds v, p and d to the dtype after each of its operations
            "reference": (br, ref.x, ref.state("exp_avg"), ref.state("exp_avg_sq"), eps_t, 16),
        }.items():
            beta_tol = [8 * arith * (1 + k) for k in want["kappa"]]
            for i, (b, w) in enumerate(zip(_betas(betas), want["beta"], strict=True)):
                assert abs(b - w) <= beta_tol[i], f"{side}: beta[{i}] {b} vs {w}"
            v_tol = [c * (eps_t * w + floor) for w in want["v"]]
            _assert_close(v, want["v"], v_tol, f"{side} v")
            d_tol = [
                c * (eps_t * (w.abs() + s) + floor) + tol * s
                for w, s, tol in zip(want["d"], want["dd_dbeta"], beta_tol, strict=True)
            ]
            _assert_close(d, want["d"], d_tol, f"{side} exp_avg")
            x_tol = [
                c * (eps_t * (xw.abs() + 0.02 * (dw / p).abs()) + floor) + 0.02 * dt / p
                for xw, dw, p, dt in zip(want["x"], want["d"], want["p"], d_tol, strict=True)
            ]
            _assert_close(x, want["x"], x_tol, f"{side} x")
        assert all(t.dtype == dtype for t in tr.d + tr.v)
        assert all(p.dtype == torch.float32 for p in tr.prods)


# --------------------------------------------------------------------------- GradScaler


def _snapshot(run):
    tensors = [run.x, run.d] + ([run.v, run.prods] if hasattr(run, "v") else [])
    tensors.append(run.steps)
    return [[None if t is None else t.clone() for t in group] for group in tensors]


def _assert_identical(after, before):
    """Bitwise equal; a buffer that did not exist before may now exist (its first step is
    still to come, see the next test)."""
    for group_a, group_b in zip(after, before, strict=True):
        for a, b in zip(group_a, group_b, strict=True):
            assert b is None or torch.equal(a, b)


# the skipped step computes with infinite gradients: NumPy warns in the interpreter
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("kind", ["amsgd", "am_adamw"])
def test_found_inf_skips_the_step_and_grad_scale_unscales(kind):
    """found_inf = 1 changes nothing; found_inf = 0 and grad_scale = 2**10 on 2**10 g are the
    plain step (a power of two scales and unscales exactly)."""
    make = TritonSGD if kind == "amsgd" else TritonAdam
    xs = _tensors(SHAPES, torch.float32, 7)
    seq = _grad_sequence(SHAPES, 3, torch.float32, 8)
    plain, scaled = make(xs), make(xs)
    one, zero = torch.ones(1, device=DEVICE), torch.zeros(1, device=DEVICE)
    scale = torch.full((1,), 2.0**10, device=DEVICE)
    for grads in seq:
        before = _snapshot(scaled)
        inf_grads = [g * float("inf") for g in grads]
        scaled.step(inf_grads, grad_scale=scale, found_inf=one)
        _assert_identical(_snapshot(scaled), before)

        bp = plain.step(grads)
        bs = scaled.step([g * 2.0**10 for g in grads], grad_scale=scale, found_inf=zero)
        _assert_identical(_snapshot(scaled), _snapshot(plain))
        assert _betas(bs) == _betas(bp)


def test_a_skipped_first_step_leaves_the_next_one_a_first_step():
    """AMSGD's first step sets d = g; when GradScaler skips it, the next step still does."""
    xs = _tensors(SHAPES, torch.float64, 9)
    grads = _grad_sequence(SHAPES, 2, torch.float64, 10)
    skipped, fresh = TritonSGD(xs), TritonSGD(xs)
    skipped.step(grads[0], found_inf=torch.ones(1, device=DEVICE))
    assert [float(s) for s in skipped.steps] == [0.0] * len(SHAPES)
    assert all(d is not None for d in skipped.d)
    skipped.step(grads[1])
    fresh.step(grads[1])
    _assert_identical(_snapshot(skipped), _snapshot(fresh))


# --------------------------------------------------------------------------- state round trip


def _sgd_state_dict(ref, run):
    sd = ref.opt.state_dict()
    sd["state"] = {
        i: {"step": run.steps[i].clone(), "momentum_buffer": run.d[i].clone(), "beta": b}
        for i, b in enumerate(run.last_betas)
    }
    return sd


def _adam_state_dict(ref, run):
    sd = ref.opt.state_dict()
    sd["state"] = {
        i: {
            "step": run.steps[i].clone(),
            "exp_avg": run.d[i].clone(),
            "exp_avg_sq": run.v[i].clone(),
            "beta1_prod": run.prods[i].clone(),
            "beta": b,
        }
        for i, b in enumerate(run.last_betas)
    }
    return sd


@pytest.mark.parametrize(
    "kind, per_layer", [("amsgd", False), ("am_adamw", True), ("am_adamw", False)]
)
def test_state_round_trip(kind, per_layer):
    """Two kernel steps, then the state goes into the optimizer's ``load_state_dict`` and both
    continue; and two optimizer steps whose state the kernels continue. Same iterates."""
    xs = _tensors(SHAPES, torch.float64, 11)
    seq = _grad_sequence(SHAPES, 4, torch.float64, 12)
    if kind == "amsgd":
        run, ref, to_dict = TritonSGD(xs, per_layer=per_layer), _ref_sgd, _sgd_state_dict
        keys = ("step", "momentum_buffer")
    else:
        run, ref, to_dict = TritonAdam(xs, per_layer=per_layer), _ref_adam, _adam_state_dict
        keys = ("step", "exp_avg", "exp_avg_sq", "beta1_prod")
    for grads in seq[:2]:
        run.last_betas = run.step(grads)
    # kernels -> optimizer
    other = ref(run.x, per_layer=per_layer)
    other.opt.load_state_dict(to_dict(other, run))
    # optimizer -> kernels
    lead = ref(xs, per_layer=per_layer)
    for grads in seq[:2]:
        lead.step(grads)
    back = (TritonSGD if kind == "amsgd" else TritonAdam)(lead.x, per_layer=per_layer)
    state = {k: [t.clone() for t in lead.state(k)] for k in keys}
    back.steps, back.d = state["step"], state[keys[1]]
    if kind != "amsgd":
        back.v, back.prods = state["exp_avg_sq"], state["beta1_prod"]
    for grads in seq[2:]:
        bt, bo = run.step(grads), other.step(grads)
        bb, bl = back.step(grads), lead.step(grads)
        tol = 64 * _eps(torch.float64)
        assert _betas(bt) == pytest.approx(_betas(bo), rel=tol, abs=tol)
        assert _betas(bb) == pytest.approx(_betas(bl), rel=tol, abs=tol)
        _assert_close(run.x, other.x, tol, "kernels -> optimizer x")
        _assert_close(back.x, lead.x, tol, "optimizer -> kernels x")
        _assert_close(run.d, other.state(keys[1]), tol, "kernels -> optimizer d")
        _assert_close(back.d, lead.state(keys[1]), tol, "optimizer -> kernels d")


# --------------------------------------------------------------------------- structure


class _CountingKernel:
    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


def test_many_tensors_and_mixed_dtypes_in_few_launches(monkeypatch):
    """24 tensors of two dtypes: one masked and one unmasked launch per dtype and kernel, and
    the global scope accumulates in float64 because one of its tensors is float64."""
    gen = torch.Generator().manual_seed(13)
    shapes = [(int(n),) for n in torch.randint(0, 90, (24,), generator=gen)]
    dtypes = [torch.float64 if i % 3 else torch.float32 for i in range(24)]
    xs = [t.to(dt) for t, dt in zip(_tensors(shapes, torch.float64, 14), dtypes, strict=True)]
    kernels = tri._kernels(tri._interpret())
    counters = {}
    for name in ("adam_reduce", "adam_apply", "segment_sum"):
        counters[name] = _CountingKernel(kernels[name])
        monkeypatch.setitem(kernels, name, counters[name])
    for per_layer in (True, False):
        tr, ref = TritonAdam(xs, per_layer=per_layer), _ref_adam(xs, per_layer=per_layer)
        tr.prods = [torch.ones((), dtype=torch.float64, device=DEVICE) for _ in xs]
        for grads in _grad_sequence(shapes, 2, torch.float64, 15):
            grads = [g.to(dt) for g, dt in zip(grads, dtypes, strict=True)]
            bt, br = tr.step(grads), ref.step(grads)
            assert [b.dtype for b in bt] == [b.dtype for b in br]
            assert _betas(bt) == pytest.approx(_betas(br), rel=1e-5, abs=1e-6)
            _assert_close(tr.x, ref.x, 1e-6, "x")
    # 2 dtypes x (whole chunks, partial chunks) x 2 steps x 2 scopes
    assert len(counters["adam_reduce"].grids) == len(counters["adam_apply"].grids) == 16
    # one segment sum per dtype (per-layer) or one for the group (global), per step
    assert len(counters["segment_sum"].grids) == 2 * 2 + 2 * 1
    assert sum(g[0] for g in counters["segment_sum"].grids[:2]) == 24  # one program per scope


@pytest.mark.parametrize("kind", ["amsgd", "am_adamw"])
def test_the_rule_is_looked_up_at_call_time(kind, monkeypatch):
    """Replacing the rule in ``amopt.core.rule`` changes the kernels' step: beta is fixed at
    0.25."""
    calls = []

    def momentum_beta(xp, sums, cfg, **kw):
        calls.append(sums.shape)
        beta = xp.full_like(sums[..., 0], 0.25)
        return beta, (beta + cfg.lam) / (1 + cfg.lam)

    def adam_beta(xp, sums, cfg, **kw):
        calls.append(sums.shape)
        return xp.full_like(sums[..., 0], 0.25)

    monkeypatch.setattr(_rule, "momentum_beta", momentum_beta)
    monkeypatch.setattr(_rule, "adam_beta", adam_beta)
    xs = _tensors(SHAPES, torch.float64, 16)
    g1, g2 = _grad_sequence(SHAPES, 2, torch.float64, 17)
    if kind == "amsgd":
        run = TritonSGD(xs, per_layer=True)
        run.step(g1)  # d = g1
        betas = run.step(g2)
        gamma = (0.25 + LAM) / (1 + LAM)
        want = [
            x - 0.05 * a - 0.05 * (b + gamma * (a - b)) for x, a, b in zip(xs, g1, g2, strict=True)
        ]
    else:
        run = TritonAdam(xs, per_layer=True)
        betas = run.step(g1)
        want = adam_oracle(
            xs, g1, [torch.zeros_like(x) for x in xs], [torch.zeros_like(x) for x in xs],
            [0.0] * len(xs), [1.0] * len(xs), lr=0.02, beta1=0.9, beta2=0.99, eps=1e-8,
            wd=0.1, mode="decoupled", maximize=False, per_layer=True, force_beta=0.25,
        )["x"]  # fmt: skip
        assert _betas(run.prods) == [0.25] * len(xs)
    # called on every scope's sums, or recorded once for one scope (the rule kernel; AM-Adam's
    # with the first-step flag a fourth input)
    assert calls and calls[0] in ((len(SHAPES), 3), (3,), (4,))
    assert _betas(betas) == [0.25] * len(xs)
    _assert_close(run.x, want, 64 * _eps(torch.float64), "x")


def test_available_says_why_not():
    x = torch.zeros(4, device=DEVICE)
    assert tri.available([x, torch.ones(4, device=DEVICE)]) is None
    assert "dtype torch.int64" in tri.available([torch.zeros(4, dtype=torch.int64, device=DEVICE)])
    assert "non-contiguous" in tri.available([torch.zeros(4, 4, device=DEVICE).T])
    assert "sparse" in tri.available([torch.zeros(4, 4, device=DEVICE).to_sparse()])
    if INTERPRET:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TRITON_INTERPRET", "0")
            assert "CUDA" in tri.available([x])


def test_argument_errors():
    xs = _tensors([(3,)], torch.float32, 0)
    run = TritonAdam(xs)
    with pytest.raises(ValueError, match=r"grads\[0\] has shape \(4,\)"):
        _adam(
            run.x, [torch.zeros(4, device=DEVICE)], run.d, run.v, run.steps, run.prods,
            config=run.config, **run.kw,
        )  # fmt: skip
    with pytest.raises(ValueError, match="weight_decay_mode"):
        _adam(
            run.x, xs, run.d, run.v, run.steps, run.prods, config=run.config,
            **{**run.kw, "weight_decay_mode": "l1"},
        )  # fmt: skip
    with pytest.raises(TypeError, match="config must be an AMConfig"):
        _sgd(run.x, xs, [None], run.steps, lr=0.1, weight_decay=0.0,
                         maximize=False, config={"lam": 0.1})  # fmt: skip
    with pytest.raises(ValueError, match="cannot run on these tensors: dtype torch.int32"):
        int32 = torch.zeros(3, dtype=torch.int32, device=DEVICE)
        _sgd([int32], [int32.clone()],
                         [None], [torch.zeros(())], lr=0.1, weight_decay=0.0, maximize=False,
                         config=_config(0.9, False))  # fmt: skip
    with pytest.raises(ValueError, match="momentum_buffer_list has 2 entries for 1 parameters"):
        _sgd(run.x, xs, [None, None], run.steps, lr=0.1, weight_decay=0.0,
                         maximize=False, config=_config(0.9, False))  # fmt: skip
    assert _sgd([], [], [], [], lr=0.1, weight_decay=0.0, maximize=False,
                            config=_config(0.9, False)) == []  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="the rows measure on a GPU here")
def test_gpu_bench_rows_say_no_gpu():
    from amopt.bench._cli import Settings, run_rows
    from benchmarks.gpu import gpt2_small_shapes, gpu_rows, llama_1b_shapes

    # GPT-2 small and Llama-3.2-1B, tied output layers: their published parameter counts
    assert sum(math.prod(s) for s in gpt2_small_shapes()) == 124_439_808
    assert sum(math.prod(s) for s in llama_1b_shapes()) == 1_235_814_400
    results = run_rows(gpu_rows(), Settings(repeat=1, quick=True))
    assert [r.row.key for r in results] == ["gpu-gpt2", "gpu-1b"]
    assert all(r.status == "skipped" and r.skipped.startswith("no GPU") for r in results)


# At lam = 0 AMSGD's beta is <g,g>/<v,v>: the same for gradients scaled by a power of two,
# which float scales exactly, as long as the squares stay in range. The sums of the
# reference run (scale 1) are float32 sums of positive terms over at most a few hundred
# elements: relative error below 300 * 2^-24 ~ 2e-5 each, 4e-5 for their ratio.
@pytest.mark.parametrize("scale", [2.0**-80, 2.0**80])
@pytest.mark.parametrize("per_layer", [True, False])
def test_amsgd_float32_beta_does_not_depend_on_the_gradient_scale(scale, per_layer):
    xs = _tensors(SHAPES, torch.float32, 40)
    g1, g2 = _grad_sequence(SHAPES, 2, torch.float32, 41)

    def betas(s):
        run = TritonSGD(xs, per_layer=per_layer)
        run.config = AMConfig.cached(lam=0.0, beta_max=0.9, numerator="linear",
                                     per_layer=per_layer)  # fmt: skip
        run.step([g * s for g in g1])
        return torch.stack([b.double() for b in run.step([g * s for g in g2])])

    reference = betas(1.0)
    nonempty = [k for k, s in enumerate(SHAPES) if math.prod(s) > 0] if per_layer else [0]
    assert bool((reference[nonempty] > 0).all())  # the empty tensor's scope: beta 0
    torch.testing.assert_close(betas(scale), reference, rtol=4e-5, atol=0)


def _rule_rows(dtype):
    """Sums of many scopes, ``<v,v>, <g,g>, <d,d>`` or ``N, D, ref``, and edge cases."""
    gen = torch.Generator().manual_seed(5)
    rows = torch.rand(300, 3, generator=gen, dtype=torch.float64)
    rows = rows * 10.0 ** (12 * torch.rand(300, 3, generator=gen, dtype=torch.float64) - 6)
    rows[:, 0] -= 0.5 * rows[:, 2] * torch.rand(300, generator=gen, dtype=torch.float64)
    edges = [
        [0.0, 1.0, 1.0],
        [1e-40, 1.0, 1.0],
        [0.0, 0.0, 0.0],
        [float("inf"), 1.0, 1.0],
        [float("nan"), 1.0, 1.0],
        [-1.0, 1.0, 2.0],
        [3.0, 1.0, 1.0],
    ]
    return torch.cat([rows, torch.tensor(edges, dtype=torch.float64)]).to(DEVICE, dtype)


def _bits(t):
    t = t.to(torch.float64).cpu()
    return torch.where(torch.isnan(t), torch.zeros_like(t), t).view(torch.int64)


RULE_CONFIGS = [
    {},
    {"lam": 0.3, "beta_max": 0.95},
    {"variant": "clip", "beta_min": 0.4},
    {"variant": "restart", "theta": 0.6, "beta_high": 0.95, "beta_low": 0.05},
]


@pytest.mark.parametrize("options", RULE_CONFIGS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["momentum_beta", "adam_beta"])
def test_the_rule_kernel_is_the_rule_bit_for_bit(name, dtype, options):
    """One launch for every scope, the same values as the rule's array operations on the
    sums' dtype (the AMSGD driver's float64 sums, AMAdamW's float32 or float64)."""
    rule = getattr(_rule, name)
    config = AMConfig.from_options(options)
    sums = _rule_rows(dtype)
    kernel = tri._kernels(INTERPRET)["rule"](rule, config, dtype)
    assert kernel is not None
    n_out = 2 if name == "momentum_beta" else 1
    out = _torch_rule.run_rule(kernel, sums, n_out, dtype, INTERPRET)
    want = rule(torch, sums, config)
    want = want if isinstance(want, tuple) else (want,)
    for got, expected in zip(out, want, strict=True):
        assert torch.equal(_bits(got), _bits(expected))


def test_a_rule_kernel_that_fails_leaves_the_rule_to_tensor_operations(monkeypatch):
    """A kernel Triton cannot build or run here: a warning, then the rule's own
    operations, with the same step."""
    xs = _tensors(SHAPES, torch.float64, 21)
    g1, g2 = _grad_sequence(SHAPES, 2, torch.float64, 22)
    want = TritonSGD(xs, per_layer=False)
    want.step(g1)
    want.step(g2)

    def broken(rule, config, dtype):
        raise RuntimeError("no compiler for the generated kernel")

    kernels = dict(tri._kernels(INTERPRET))
    kernels["rule"] = broken
    monkeypatch.setattr(tri, "_kernels", lambda interpret: kernels)
    # the rule's failure is remembered for the process: here, for this test only
    monkeypatch.setattr(tri, "_RULE_BY_KEY", {})
    got = TritonSGD(xs, per_layer=False)
    with pytest.warns(RuntimeWarning, match="rule's Triton kernel failed"):
        got.step(g1)
        got.step(g2)
    for a, b in zip(got.x, want.x, strict=True):
        assert torch.equal(a, b)
