"""The fused CPU kernels of ``amopt.torch._fused``: reduce, apply, driver, loading.

* Each exported REDUCE / APPLY kernel, in every ISA variant this CPU runs, against
  the formulas of ``docs/algorithms.md`` evaluated here in NumPy float64.
* The driver: the rule is the one of ``amopt.core.rule`` (looked up at call time), the
  chunking of per-layer scopes does not change the iterates, ``grad_scale`` and
  ``found_inf`` follow ``torch.amp.GradScaler``'s fused protocol, and the fallback
  reasons name the real cause.
* Loading compiled code: a library planted where kernels were once built is never
  loaded, a corrupt cached library is rebuilt, a cache directory that another user
  could write is refused, and so is a stale or unsafe install-time library.
"""

from __future__ import annotations

import ctypes
import os
import re
import stat
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from amopt.core import rule as _rule  # noqa: E402
from amopt.core.config import AMConfig  # noqa: E402
from amopt.torch import AMSGD, AMAdamW, _fused  # noqa: E402
from amopt.torch._amadamw import _fused_am_adamw  # noqa: E402
from amopt.torch._records import (  # noqa: E402
    AdamHyper,
    AdamTensors,
    Scaler,
    SGDHyper,
    SGDTensors,
)

if _fused.library() is None:
    pytest.skip(
        f"no fused kernels here: {_fused.fused_status()['error']}", allow_module_level=True
    )

KERNELS = _fused.library()
LEVELS = [isa for level, isa in enumerate(_fused.ISAS) if level <= KERNELS.cpu_level]
DTYPES = {"f64": (torch.float64, 1e-12), "f32": (torch.float32, 2e-5)}
RNG_SEED = 20260101


# --------------------------------------------------------------------------- helpers


def _bind(kernel: str, suffix: str, isa: str):
    """The exported kernel ``am_<kernel>_<suffix>_<isa>`` with the driver's signature."""
    fn = getattr(KERNELS.lib, f"am_{kernel}_{suffix}_{isa}")
    fn.argtypes = KERNELS.fn[f"{kernel}_{suffix}"].argtypes
    fn.restype = ctypes.c_int
    return fn


def _tensors(sizes, count, dtype, seed, positive=()):
    """``count`` lists of random tensors with the given sizes (entries of ``positive`` > 0)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k in range(count):
        ts = [torch.randn(n, generator=gen, dtype=torch.float64) for n in sizes]
        if k in positive:
            ts = [t.abs() + 0.1 for t in ts]
        out.append([t.to(dtype) for t in ts])
    return out


def _f64(ts):
    return [t.double().numpy().copy() for t in ts]


def _arrays(sizes, *lists):
    return _fused._Arrays(sizes, [[t.data_ptr() for t in ts] for ts in lists])


def _close(actual, expected, tol, what):
    """Equal up to ``tol`` relative to the largest magnitude (elementwise cancellation)."""
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale, err_msg=what)


@pytest.fixture
def fresh_library(monkeypatch, tmp_path):
    """A library state to be found again, with no install-time library and a cache in tmp."""
    monkeypatch.setattr(_fused, "_state", {"tried": False, "lib": None, "error": None})
    monkeypatch.setattr(_fused, "installed_library", lambda: None)
    monkeypatch.setenv("AMOPT_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("AMOPT_CPU_FEATURES", raising=False)
    return tmp_path / "cache"


def _compile(tmp: Path, name: str, code: str, *flags: str) -> Path:
    cc = _fused._compiler()
    if not cc:
        pytest.skip("no C compiler")
    src = tmp / f"{name}.c"
    src.write_text(code)
    out = tmp / f"{name}.so"
    subprocess.run([*cc, "-shared", "-fPIC", *flags, str(src), "-o", str(out)], check=True)
    return out


def _planted_library(tmp: Path, marker: Path) -> Path:
    """A library whose constructor creates ``marker``: it must never be loaded."""
    code = (
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void planted(void) {\n"
        f'    FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("loaded", f); fclose(f); }}\n'
        "}\n"
        "int am_abi_version(void) { return %d; }\n" % _fused.ABI_VERSION
    )
    return _compile(tmp, "planted", code)


# --------------------------------------------------------------------------- AMSGD kernels


@pytest.mark.parametrize("isa", LEVELS)
@pytest.mark.parametrize("suffix", DTYPES)
@pytest.mark.parametrize("wd, gmul", [(0.0, 1.0), (0.05, -0.25)])
def test_sgd_reduce_and_apply_match_the_formulas(isa, suffix, wd, gmul):
    dtype, tol = DTYPES[suffix]
    sizes = [1000, 37, 70001]
    xs, gs, ds = _tensors(sizes, 3, dtype, RNG_SEED)
    x0, g0, d0 = _f64(xs), _f64(gs), _f64(ds)
    first = (ctypes.c_uint8 * 3)(0, 1, 0)  # tensor 1: step 0, d = g
    hp = (ctypes.c_double * 3)(gmul, wd, 0.1)
    arrays = _arrays(sizes, xs, gs, ds)
    numel, x, g, d = arrays.at(0)
    sums = torch.zeros((3, 3), dtype=torch.float64)
    assert _bind("sgd_reduce", suffix, isa)(3, numel, x, g, d, ctypes.addressof(first), hp, 1,
                                           sums.data_ptr()) == 0  # fmt: skip
    gammas = torch.tensor([0.3, 0.7, 0.55], dtype=dtype)
    _bind("sgd_apply", suffix, isa)(3, numel, x, g, d, ctypes.addressof(first),
                                    gammas.data_ptr(), 1, hp, 1)  # fmt: skip
    for k in range(3):
        gk = g0[k] * gmul + wd * x0[k]
        dk = gk if k == 1 else d0[k]
        v = dk - gk
        expected = [v @ v, gk @ gk, dk @ dk]
        _close(sums[k].numpy(), expected, tol, f"sums of tensor {k}")
        dn = gk + float(gammas[k]) * (dk - gk)
        _close(_f64([ds[k]])[0], dn, tol, f"d of tensor {k}")
        _close(_f64([xs[k]])[0], x0[k] - 0.1 * dn, tol, f"x of tensor {k}")


def test_sgd_apply_one_gamma_for_all_with_stride_zero():
    sizes = [5, 9]
    xs, gs, ds = _tensors(sizes, 3, torch.float64, 1)
    x0, g0, d0 = _f64(xs), _f64(gs), _f64(ds)
    first = (ctypes.c_uint8 * 2)()
    hp = (ctypes.c_double * 3)(1.0, 0.0, 0.5)
    arrays = _arrays(sizes, xs, gs, ds)
    numel, x, g, d = arrays.at(0)
    gamma = torch.tensor(0.25, dtype=torch.float64)
    KERNELS.fn["sgd_apply_f64"](2, numel, x, g, d, ctypes.addressof(first), gamma.data_ptr(),
                                0, hp, 1)  # fmt: skip
    for k in range(2):
        dn = g0[k] + 0.25 * (d0[k] - g0[k])
        np.testing.assert_allclose(ds[k].numpy(), dn, rtol=1e-15)
        np.testing.assert_allclose(xs[k].numpy(), x0[k] - 0.5 * dn, rtol=1e-15)


# --------------------------------------------------------------------------- AM-Adam kernels


def _adam_reference(x, g, d, v, *, c, ib2, gmul, l2, beta2, eps, lam, weights):
    g = g * gmul + l2 * x
    v = beta2 * v + (1 - beta2) * g * g
    p = c * (eps + np.sqrt(v * ib2))
    u = 1 / (1 + lam * p)
    w = u / p
    terms = [g * g / p, u * (d - g) ** 2, g * d / p, g * x, d * x]
    num = sum(a * np.sum(t) for a, t in zip(weights, terms, strict=True))
    den = np.sum(w * (d - g) ** 2)
    ref = np.sum(w * d * d) + np.sum(w * g * g)
    return g, v, p, [num, den, ref]


# The float32 kernels square before they weight: a square below float's normal range
# (|g| < 2^-63) carries an absolute error up to 2^-150, and a small eps lets the weights
# 1/p ~ 1/(c eps) magnify it (at |g| = 2^-74, eps = 1e-20: errors of 2^-84 against terms
# of 2^-82). Blocks whose sums are that small are summed in double: every sum keeps
# float's block-summation accuracy, rtol 2e-5 (see DTYPES), at every gradient scale.
# The reference takes the kernel's own float32 v (torch's AdamW squares in float too).
@pytest.mark.parametrize("isa", LEVELS)
@pytest.mark.parametrize("exponent, eps", [(-60, 1e-12), (-70, 1e-20), (-74, 1e-20)])
def test_adam_sums_keep_float_accuracy_when_squares_are_subnormal(isa, exponent, eps):
    n = 5000
    gen = torch.Generator().manual_seed(RNG_SEED + 7)
    g64 = torch.randn(n, generator=gen, dtype=torch.float64) * 2.0**exponent
    d64 = g64 * (1.0 + torch.randn(n, generator=gen, dtype=torch.float64))
    x, g, d = torch.randn(n, generator=gen), g64.float(), d64.float()
    v = torch.zeros(n)
    x0, g0, d0 = _f64([x, g, d])
    beta2, lam = 0.99, 0.2
    cfg = AMConfig(lam=lam, beta_max=0.9, numerator="linear")
    weights = _rule.adam_weights(cfg, lr=0.01, weight_decay=0.1)
    hp = (ctypes.c_double * 13)(1.0, 0.0, beta2, eps, lam, 0.01, 0.999, 1.0, *weights)
    c, ib2 = torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64)
    arrays = _arrays([n], [x], [g], [d], [v])
    numel, xa, ga, da, va = arrays.at(0)
    sums = torch.zeros(3, dtype=torch.float64)
    _bind("adam_reduce", "f32", isa)(1, numel, xa, ga, da, va, c.data_ptr(), 1,
                                     ib2.data_ptr(), hp, 1, sums.data_ptr())  # fmt: skip
    *_, expected = _adam_reference(
        x0, g0, d0, _f64([v])[0], c=1.0, ib2=1.0, gmul=1.0, l2=0.0, beta2=1.0, eps=eps,
        lam=lam, weights=weights,
    )  # fmt: skip
    assert expected[1] > 0 and expected[2] > 0
    scale = np.abs(expected).max()
    np.testing.assert_allclose(sums.numpy(), expected, rtol=2e-5, atol=2e-5 * scale)


# The kernels take the numerator's weights a_k as data: besides the rule's, any weights
# give sum_k a_k S_k, including a0 = 0 (the kernels' loop folds the S0, S1, S2 terms into
# one sum with a2 / a0, so that case sums by the definition).
OTHER_WEIGHTS = {
    "rule": None,
    "arbitrary": (1.7, -0.4, 0.3, 0.2, -0.6),
    "a0 zero": (0.0, -0.3, 0.5, 0.2, -0.1),
}


@pytest.mark.parametrize("isa", LEVELS)
@pytest.mark.parametrize("suffix", DTYPES)
@pytest.mark.parametrize(
    "mode, weights_of, lam",
    [("decoupled", "rule", 0.2), ("proximal", "rule", 0.2), ("l2", "rule", 0.2),
     ("decoupled", "rule", 0.0), ("decoupled", "arbitrary", 0.2), ("decoupled", "a0 zero", 0.2)],
)  # fmt: skip
@pytest.mark.parametrize("gmul", [1.0, -0.125])
def test_adam_reduce_and_apply_match_the_formulas(isa, suffix, mode, weights_of, lam, gmul):
    dtype, tol = DTYPES[suffix]
    sizes = [3000, 17, 70001]
    xs, gs, ds, vs = _tensors(sizes, 4, dtype, RNG_SEED + 1, positive=(3,))
    for t in ds:
        t.mul_(0.3)
    x0, g0, d0, v0 = _f64(xs), _f64(gs), _f64(ds), _f64(vs)
    lr, beta2, eps, wd = 0.01, 0.99, 1e-3, 0.1
    cfg = AMConfig(lam=lam, beta_max=0.9, numerator="linear")
    rule_wd = 0.0 if mode == "l2" else wd
    weights = OTHER_WEIGHTS[weights_of] or _rule.adam_weights(cfg, lr=lr, weight_decay=rule_wd)
    decay = 1 - lr * wd if mode == "decoupled" else 1.0
    shrink = 1 / (1 + lr * wd) if mode == "proximal" else 1.0
    l2 = wd if mode == "l2" else 0.0
    hp = (ctypes.c_double * 13)(gmul, l2, beta2, eps, lam, lr, decay, shrink, *weights)
    c = torch.tensor([0.5, 0.8, 0.3], dtype=dtype)
    ib2 = torch.tensor([10.0, 2.0, 1.5], dtype=torch.float64)
    arrays = _arrays(sizes, xs, gs, ds, vs)  # keeps the address arrays alive
    numel, x, g, d, v = arrays.at(0)
    sums = torch.zeros((3, 3), dtype=torch.float64)
    _bind("adam_reduce", suffix, isa)(3, numel, x, g, d, v, c.data_ptr(), 1, ib2.data_ptr(),
                                      hp, 1, sums.data_ptr())  # fmt: skip
    betas = torch.tensor([0.0, 0.45, 0.9], dtype=dtype)
    _bind("adam_apply", suffix, isa)(3, numel, x, g, d, v, c.data_ptr(), 1, ib2.data_ptr(),
                                     betas.data_ptr(), 1, hp, _fused._MODES[mode], 1)  # fmt: skip
    for k in range(3):
        gk, vk, p, expected = _adam_reference(
            x0[k], g0[k], d0[k], v0[k], c=float(c[k]), ib2=float(ib2[k]), gmul=gmul, l2=l2,
            beta2=beta2, eps=eps, lam=lam, weights=weights,
        )  # fmt: skip
        scale = np.abs(expected).max()
        np.testing.assert_allclose(sums[k].numpy(), expected, rtol=tol, atol=tol * scale)
        _close(_f64([vs[k]])[0], vk, tol, f"v of tensor {k}")
        coef = (float(betas[k]) + lam * p) / (1 + lam * p)
        dn = gk + coef * (d0[k] - gk)
        _close(_f64([ds[k]])[0], dn, tol, f"d of tensor {k}")
        if mode == "proximal":
            xn = (x0[k] - lr * dn / p) / (1 + lr * wd)
        else:
            xn = decay * x0[k] - lr * dn / p
        _close(_f64([xs[k]])[0], xn, tol, f"x of tensor {k}")


@pytest.mark.parametrize("isa", LEVELS)
@pytest.mark.parametrize("suffix", ["f32", "f64"])
@pytest.mark.parametrize("has_x", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_adam_traffic_reads_every_array_and_changes_none(isa, suffix, has_x, threads):
    """The bench's floor kernel: the first pass sums what it reads (g, d, v and, with
    has_x, x) in every chunk; nothing is modified. The float block sums carry a relative
    error of at most about 128 terms x 2^-24 of the sum of magnitudes."""
    dtype, tol = DTYPES[suffix]
    sizes = [70_001, 5, 300_000]  # the last one is split across threads
    ts = _tensors(sizes, 4, dtype, 9, positive=(3,))
    before = [t.clone() for t in sum(ts, [])]
    arrays = _arrays(sizes, *ts)
    chunks = np.array([0, 2, 2, 3], dtype=np.int64)  # two chunks: tensors 0-1, tensor 2
    sums = np.full(2, np.nan)
    one_zero = np.array([1.0, 0.0])
    status = _bind("adam_traffic", suffix, isa)(
        3, *arrays.at(0), int(has_x), one_zero.ctypes.data, threads, chunks.ctypes.data, 2,
        sums.ctypes.data,
    )  # fmt: skip
    assert status == 0
    x, g, d, v = (_f64(a) for a in ts)
    read = (g, d, v, x) if has_x else (g, d, v)
    for q, (a, b) in enumerate([(0, 2), (2, 3)]):
        parts = [arr[j] for arr in read for j in range(a, b)]
        expected = sum(float(p.sum()) for p in parts)
        magnitude = sum(float(np.abs(p).sum()) for p in parts)
        assert abs(sums[q] - expected) <= tol * magnitude, (q, sums[q], expected)
    assert all(torch.equal(t, b) for t, b in zip(sum(ts, []), before, strict=True))


def test_adam_traffic_runs_on_optimizer_tensors():
    """The Python entry point takes the tensors of a fused AMAdamW and leaves them as they were."""
    gen = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(n, generator=gen)) for n in (1000, 3)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    opt = AMAdamW(params, lr=1e-3, fused=True)
    opt.step()
    state = [[opt.state[p][k] for p in params] for k in ("exp_avg", "exp_avg_sq")]
    arrays = [list(params), [p.grad for p in params], *state]
    before = [[t.detach().clone() for t in a] for a in arrays]
    total = _fused.adam_traffic(*arrays, has_x=False)
    expected = sum(float(t.double().sum()) for a in arrays[1:] for t in a)
    magnitude = sum(float(t.double().abs().sum()) for a in arrays[1:] for t in a)
    assert abs(total - expected) <= 2e-5 * magnitude
    pairs = zip(sum(arrays, []), sum(before, []), strict=True)
    assert all(torch.equal(t, b) for t, b in pairs)
    with pytest.raises(ValueError, match="adam_traffic"):
        _fused.adam_traffic(*arrays[:3], [t.double() for t in arrays[3]])


@pytest.mark.parametrize("kernel", ["sgd", "adam"])
def test_threads_split_large_tensors_to_the_same_result(kernel):
    """A tensor above the OpenMP threshold gives the single-thread sums and updates."""
    if not KERNELS.openmp:
        pytest.skip("kernels built without OpenMP")
    sizes = [300_001]
    results = []
    for nt in (1, 3):
        ts = _tensors(sizes, 4, torch.float64, 5, positive=(3,))
        arrays = _arrays(sizes, *ts)
        numel, x, g, d, v = arrays.at(0)
        sums = torch.zeros((1, 3), dtype=torch.float64)
        coef = torch.tensor([0.6], dtype=torch.float64)
        if kernel == "sgd":
            first = (ctypes.c_uint8 * 1)()
            hp = (ctypes.c_double * 3)(1.0, 0.01, 0.1)
            KERNELS.fn["sgd_reduce_f64"](1, numel, x, g, d, ctypes.addressof(first), hp, nt,
                                         sums.data_ptr())  # fmt: skip
            KERNELS.fn["sgd_apply_f64"](1, numel, x, g, d, ctypes.addressof(first),
                                        coef.data_ptr(), 1, hp, nt)  # fmt: skip
        else:
            hp = (ctypes.c_double * 13)(1.0, 0, 0.99, 1e-8, 0.1, 1e-3, 0.9999, 1, 1, -0.1, 0, 0, 0)
            c, ib2 = torch.tensor([0.1], dtype=torch.float64), torch.tensor([100.0]).double()
            KERNELS.fn["adam_reduce_f64"](1, numel, x, g, d, v, c.data_ptr(), 1, ib2.data_ptr(),
                                          hp, nt, sums.data_ptr())  # fmt: skip
            KERNELS.fn["adam_apply_f64"](1, numel, x, g, d, v, c.data_ptr(), 1, ib2.data_ptr(),
                                         coef.data_ptr(), 1, hp, 0, nt)  # fmt: skip
        results.append((sums.clone(), [t[0].clone() for t in ts]))
    (s1, t1), (s3, t3) = results
    np.testing.assert_allclose(s3.numpy(), s1.numpy(), rtol=1e-13)
    for a, b in zip(t3, t1, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-14)


# --------------------------------------------------------------------------- the driver


def _adam_group(sizes, dtype=torch.float64, seed=3):
    x, g = _tensors(sizes, 2, dtype, seed)
    d = [torch.zeros_like(t) for t in x]
    v = [torch.zeros_like(t) for t in x]
    steps = [torch.zeros((), dtype=torch.float32) for _ in x]
    prods = [torch.ones((), dtype=dtype) for _ in x]
    return x, g, d, v, steps, prods


ADAM_HYPER = {
    "lr": 0.01,
    "beta2": 0.99,
    "eps": 1e-8,
    "weight_decay": 0.1,
    "weight_decay_mode": "decoupled",
    "maximize": False,
}


def _adam_steps(group, grads_at, n_steps, per_layer=True, **extra):
    cfg = AMConfig.cached(lam=0.1, beta_max=0.9, numerator="linear", per_layer=per_layer)
    x, _, d, v, steps, prods = group
    amp = Scaler(**{k: extra.pop(k) for k in ("grad_scale", "found_inf") if k in extra})
    out = None
    for t in range(n_steps):
        out = _fused.fused_am_adamw(
            AdamTensors(x, grads_at(t), d, v, steps, prods),
            AdamHyper(**ADAM_HYPER, config=cfg),
            amp,
            **extra,
        )
        if out is not None and not isinstance(out, str):
            prods = out[1]
    return out, prods


def _grads_at(sizes, dtype=torch.float64):
    return lambda t: _tensors(sizes, 1, dtype, 100 + t)[0]


def test_per_layer_chunks_do_not_change_the_iterates(monkeypatch):
    """One tensor per chunk and one chunk for all give the same iterates, bit for bit."""
    sizes = [4000, 3, 9000, 500]
    runs = []
    for chunk in ("1", str(10**9)):
        monkeypatch.setenv("AMOPT_FUSED_CHUNK_BYTES", chunk)
        group = _adam_group(sizes)
        (betas, _), prods = _adam_steps(group, _grads_at(sizes), 5)
        runs.append((group, betas, prods))
    (g1, b1, p1), (g2, b2, p2) = runs
    for a, b in zip(g1[0] + g1[2] + g1[3], g2[0] + g2[2] + g2[3], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(torch.stack(b1), torch.stack(b2))
    assert torch.equal(torch.stack(p1), torch.stack(p2))


def test_chunks_fit_the_budget():
    assert _fused._chunks([4, 4, 4, 10, 1], 8) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert _fused._chunks([3], 1) == [(0, 1)]
    assert _fused._chunks([1, 1, 1], 100) == [(0, 3)]


@pytest.mark.parametrize("per_layer", [True, False])
def test_the_rule_is_looked_up_at_call_time(monkeypatch, per_layer):
    """Replacing amopt.core.rule.adam_beta changes the beta the apply kernel uses."""
    sizes = [50, 7]
    seen = []

    def fixed(xp, sums, cfg, *, lr=None, weight_decay=0.0, f_decrease=None, first=None):
        seen.append(tuple(sums.shape))
        return xp.zeros_like(sums[..., 0]) + 0.25

    monkeypatch.setattr(_rule, "adam_beta", fixed)
    x, g, d, v, steps, prods = _adam_group(sizes)
    d = [0.5 * t for t in g]  # a nonzero momentum, so that beta shows in the update
    x0 = [t.clone() for t in x]
    cfg = AMConfig.cached(lam=0.0, beta_max=0.9, numerator="linear", per_layer=per_layer)
    hyper = {**ADAM_HYPER, "weight_decay": 0.0}
    betas, new_prods = _fused.fused_am_adamw(
        AdamTensors(x, g, d, v, steps, prods), AdamHyper(**hyper, config=cfg)
    )
    assert [float(b) for b in betas] == [0.25, 0.25]
    assert [float(p) for p in new_prods] == [0.25, 0.25]
    # run per chunk on the three sums, or recorded with the first-step flag a fourth input
    assert seen and all(shape[-1] in (3, 4) for shape in seen)
    for k in range(2):  # lam = 0: d = 0.25 d_old + 0.75 g, x -= lr d / p
        gk = g[k].numpy()
        dn = 0.25 * (0.5 * gk) + 0.75 * gk
        np.testing.assert_allclose(d[k].numpy(), dn, rtol=1e-14)
        p = (1 - 0.9) * (1e-8 + np.abs(gk))  # c = 1 - beta1_max, v_hat = g^2 at step 1
        np.testing.assert_allclose(x[k].numpy(), x0[k].numpy() - 0.01 * dn / p, rtol=1e-12)


@pytest.mark.parametrize("scale", [1024.0, 3.0])
@pytest.mark.parametrize("per_layer", [True, False])
def test_adam_grad_scale_unscales_the_gradients(scale, per_layer):
    sizes = [300, 20]
    plain, scaled = _adam_group(sizes), _adam_group(sizes)
    grads = _grads_at(sizes)
    _adam_steps(plain, grads, 4, per_layer)
    _adam_steps(
        scaled,
        lambda t: [scale * g for g in grads(t)],
        4,
        per_layer,
        grad_scale=torch.tensor(scale),
        found_inf=torch.tensor(0.0),
    )
    tol = 1e-12  # the scaled run takes the kernels' general loop: other sum orders
    for a, b in zip(
        plain[0] + plain[2] + plain[3], scaled[0] + scaled[2] + scaled[3], strict=True
    ):
        torch.testing.assert_close(b, a, rtol=tol, atol=tol)


def test_adam_found_inf_skips_the_step_and_leaves_the_state():
    sizes = [30, 4]
    group = _adam_group(sizes)
    _adam_steps(group, _grads_at(sizes), 2)
    before = [t.clone() for ts in (group[0], group[2], group[3], group[4]) for t in ts]
    out, _ = _adam_steps(group, _grads_at(sizes), 1, found_inf=torch.tensor(1.0))
    assert out is None
    after = [t for ts in (group[0], group[2], group[3], group[4]) for t in ts]
    for a, b in zip(after, before, strict=True):
        assert torch.equal(a, b)


def _sgd_steps(sizes, n_steps, scale=1.0, per_layer=False, **extra):
    cfg = AMConfig.cached(lam=0.1, beta_max=0.9, numerator="linear", per_layer=per_layer)
    xs = _tensors(sizes, 1, torch.float64, 9)[0]
    bufs, steps = [None] * len(sizes), [torch.zeros(()) for _ in sizes]
    betas = None
    for t in range(n_steps):
        grads = [scale * g for g in _grads_at(sizes)(t)]
        betas = _fused.fused_amsgd(
            SGDTensors(xs, grads, bufs, steps),
            SGDHyper(lr=0.05, weight_decay=0.01, maximize=False, config=cfg),
            Scaler(**extra),
        )
    return xs, bufs, steps, betas


@pytest.mark.parametrize("per_layer", [True, False])
def test_sgd_grad_scale_unscales_the_gradients(per_layer):
    ref = _sgd_steps([100, 7], 4, per_layer=per_layer)
    scaled = _sgd_steps([100, 7], 4, 4096.0, per_layer, grad_scale=torch.tensor(4096.0))
    for a, b in zip(ref[0] + ref[1], scaled[0] + scaled[1], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(torch.stack(ref[3]), torch.stack(scaled[3]))


def test_sgd_found_inf_skips_even_the_first_step():
    xs, bufs, steps, betas = _sgd_steps([10, 3], 1, found_inf=torch.tensor(float("inf")))
    assert betas is None and bufs == [None, None]
    assert [float(s) for s in steps] == [0.0, 0.0]
    assert torch.equal(xs[0], _tensors([10, 3], 1, torch.float64, 9)[0][0])


def test_fallback_unscales_the_gradients(monkeypatch):
    """A group the kernels cannot run (non-contiguous) takes foreach with g / grad_scale."""
    monkeypatch.setattr(_fused, "_warned", set())
    sizes = [12]
    runs = []
    for scale in (None, 8.0):
        base = _tensors([24], 1, torch.float64, 4)[0][0]
        x = [base[::2]]  # not contiguous
        g = [_tensors(sizes, 1, torch.float64, 5)[0][0] * (scale or 1.0)]
        d, v = [torch.zeros(12, dtype=torch.float64)], [torch.zeros(12, dtype=torch.float64)]
        steps, prods = [torch.zeros(())], [torch.ones((), dtype=torch.float64)]
        cfg = AMConfig.cached(lam=0.1, beta_max=0.9, numerator="linear", per_layer=True)
        amp = Scaler(None if scale is None else torch.tensor(scale))
        with pytest.warns(_fused.FusedFallbackWarning, match="contiguous"):
            _fused_am_adamw(AdamTensors(x, g, d, v, steps, prods),
                            AdamHyper(**ADAM_HYPER, config=cfg), amp, None)  # fmt: skip
        monkeypatch.setattr(_fused, "_warned", set())
        runs.append((x[0].clone(), d[0].clone()))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


class _Wrapper(torch.Tensor):
    """A tensor subclass with its own dispatch (as DTensor): no local storage to address."""

    @staticmethod
    def __new__(cls, data):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype)

    def __init__(self, data):
        self.inner = data

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(t):
            return t.inner if isinstance(t, _Wrapper) else t

        args = torch.utils._pytree.tree_map(unwrap, args)
        kwargs = torch.utils._pytree.tree_map(unwrap, kwargs or {})
        return func(*args, **kwargs)


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda: _Wrapper(torch.zeros(4)), "_Wrapper parameters or states have no plain"),
        (lambda: torch.zeros(8)[::2], "dense, contiguous"),
        (lambda: torch.zeros(4, dtype=torch.float16), "float32/float64"),
        (lambda: torch.zeros(4).to_sparse(), "dense, contiguous"),
    ],
)
def test_fallback_reasons_name_the_cause(make, reason):
    x = make()
    g = torch.zeros(4, dtype=x.dtype)
    out = _fused._check([[x], [g]])
    assert isinstance(out, str) and reason in out
    assert _fused._check_common([[x], [g]]) is None  # the quick check lets none through


def test_mixed_dtypes_aliasing_and_sizes_are_refused():
    x, g = torch.zeros(4), torch.zeros(4, dtype=torch.float64)
    assert "mixes torch.float32 and torch.float64" in _fused._check([[x], [g]])
    assert "shares memory" in _fused._check([[x], [x]])
    assert "another size" in _fused._check([[x], [torch.zeros(5)]])
    for arrays in ([[x], [g]], [[x], [x]], [[x], [torch.zeros(5)]]):
        assert _fused._check_common(arrays) is None


def test_dtensor_parameters_fall_back_with_the_reason(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        x = torch.nn.Parameter(distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)]))
        g = distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)])
        out = _fused._check([[x], [g]])
    finally:
        dist.destroy_process_group()
    assert isinstance(out, str) and "DTensor" in out


# --------------------------------------------------------------------------- CPU dispatch


@pytest.mark.parametrize("request_, expected", [("avx2", "avx2"), ("baseline", "base")])
def test_cpu_features_limit_the_variant(fresh_library, monkeypatch, request_, expected):
    if expected == "avx2" and KERNELS.cpu_level < 1:
        pytest.skip("this CPU has no AVX2")
    monkeypatch.setattr(_fused, "installed_library", lambda: KERNELS.path)
    monkeypatch.setattr(_fused, "_open_installed", lambda path: KERNELS.lib)
    monkeypatch.setenv("AMOPT_CPU_FEATURES", request_)
    assert _fused.fused_status()["isa"] == expected


def test_unknown_cpu_features_are_an_error(fresh_library, monkeypatch):
    monkeypatch.setattr(_fused, "installed_library", lambda: KERNELS.path)
    monkeypatch.setattr(_fused, "_open_installed", lambda path: KERNELS.lib)
    monkeypatch.setenv("AMOPT_CPU_FEATURES", "sse9")
    status = _fused.fused_status()
    assert not status["available"] and "AMOPT_CPU_FEATURES must be one of" in status["error"]


def test_every_element_loop_is_vectorised(tmp_path):
    """GCC vectorises every ``omp simd`` element loop of the kernels, in every variant and
    flag specialisation: its vectoriser report names none of them as missed and each as
    vectorised. (A branch on a run-time flag in a loop that calls ``fma()`` once left the
    scaled, L2 and proximal loops scalar, 5-7x slower.)"""
    cc = _fused._compiler()
    version = _fused._compiler_version(cc) if cc else ""
    if "gcc" not in version.lower() or "clang" in version.lower():
        pytest.skip(f"the vectoriser report is GCC's; compiler here: {version or 'none'}")
    flags = [f for f in _fused._BASE_FLAGS if f != "-shared"]
    report = tmp_path / "vec.txt"
    cmd = [*cc, *flags, "-fopenmp-simd", "-c", str(_fused.CSRC / "am_fused.c"),
           "-o", str(tmp_path / "k.o"), f"-fopt-info-vec-optimized-missed={report}"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    source = (_fused.CSRC / "am_fused_kernels.h").read_text().splitlines()
    # GCC reports a loop at its for line or at the first line of its body
    loops = [k + 2 for k, line in enumerate(source) if line.strip() == "#pragma omp simd"
             or line.strip().startswith("#pragma omp simd ")]  # fmt: skip
    assert len(loops) >= 6

    lines = report.read_text().splitlines()

    def at(line):
        pattern = re.compile(rf"am_fused_kernels\.h:({line}|{line + 1}):\d+: ")
        return [r for r in lines if pattern.search(r)]

    for line in loops:
        reports = at(line)
        assert not [r for r in reports if "missed" in r and "vectoriz" in r], source[line - 1]
        assert [r for r in reports if "loop vectorized" in r], source[line - 1]


def test_the_library_has_every_variant():
    assert KERNELS.lib.am_isa_built() & 1
    if os.uname().machine == "x86_64":
        assert KERNELS.lib.am_isa_built() == 7


# --------------------------------------------------------------------------- loading safely


@pytest.mark.slow
def test_a_library_planted_in_the_old_fallback_place_is_never_loaded(fresh_library, tmp_path):
    """The old fallback loaded ``$TMPDIR/amopt-kernels-<uid>/<name>`` (anyone can create it)."""
    cc = _fused._compiler()
    marker = tmp_path / "planted-was-loaded"
    planted = _planted_library(tmp_path, marker)
    old = Path(tempfile.gettempdir()) / f"amopt-kernels-{os.getuid()}"
    old.mkdir(mode=0o777, exist_ok=True)
    target = old / _fused.library_name(cc)
    saved = target.read_bytes() if target.exists() else None
    try:
        target.write_bytes(planted.read_bytes())
        # the configured cache is refused (world-writable), so the kernels are built
        # elsewhere; a planted copy inside it must not be loaded either
        fresh_library.mkdir()
        (fresh_library / target.name).write_bytes(planted.read_bytes())
        os.chmod(fresh_library, 0o777)
        status = _fused.fused_status()
    finally:
        if saved is None:
            target.unlink()
        else:
            target.write_bytes(saved)
    assert status["available"], status
    assert status["origin"] == "temporary"
    assert "writable by group or others" in " ".join(status["notes"])
    assert not marker.exists()
    path = Path(status["path"])
    assert path.parent != old and path.parent != fresh_library
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700


@pytest.mark.slow
def test_a_corrupt_cached_library_is_rebuilt(fresh_library, tmp_path):
    first = _fused.fused_status()
    assert first["available"] and first["origin"] == "cache", first
    path = Path(first["path"])
    assert stat.S_IMODE(os.stat(fresh_library).st_mode) == 0o700
    recorded = Path(str(path) + ".sha256").read_text().strip()
    assert recorded == _fused._sha256_file(path)

    planted = _planted_library(tmp_path, tmp_path / "m").read_bytes()
    for corrupt in (b"\x7fELF not a library", planted):
        path.unlink()  # a new file: the library loaded above stays mapped as it was
        path.write_bytes(corrupt)
        _fused._state.update(tried=False, lib=None, error=None)
        again = _fused.fused_status()
        assert again["available"] and again["path"] == str(path), again
        assert _fused._sha256_file(path) == recorded  # rebuilt: the same bytes as built
        assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda d, mp: os.chmod(d, 0o777), "writable by group or others"),
        (lambda d, mp: os.chmod(d, 0o770), "writable by group or others"),
        (lambda d, mp: mp.setattr(os, "getuid", lambda: os.stat(d).st_uid + 1), "owned by uid"),
    ],
    ids=["mode-0777", "mode-0770", "other-owner"],
)
def test_an_unsafe_cache_directory_is_refused(tmp_path, monkeypatch, spoil, message):
    cache = tmp_path / "cache"
    assert _fused.private_directory(cache) == cache.resolve()
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    spoil(cache, monkeypatch)
    with pytest.raises(_fused.UnsafeKernelPath, match=message):
        _fused.private_directory(cache)


def test_a_cache_below_a_world_writable_directory_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(_fused.UnsafeKernelPath, match="writable by everyone"):
        _fused.private_directory(shared / "cache")
    os.chmod(shared, 0o1777)  # sticky, as /tmp: others cannot rename our entries
    assert _fused.private_directory(shared / "cache2").is_dir()


def test_an_unsafe_or_stale_installed_library_is_not_used(tmp_path, monkeypatch):
    stale = _compile(
        tmp_path,
        "stale",
        (_fused.CSRC / "am_fused.c").read_text(),
        f"-I{_fused.CSRC}",
        '-DAM_SOURCE_HASH="0000"',
    )
    with pytest.raises(RuntimeError, match="other kernel sources"):
        _fused._open_installed(stale)
    os.chmod(stale, 0o775)
    with pytest.raises(_fused.UnsafeKernelPath, match="writable by group or others"):
        _fused._open_installed(stale)
    os.chmod(stale, 0o755)
    os.chmod(tmp_path, 0o777)
    with pytest.raises(_fused.UnsafeKernelPath, match="package directory"):
        _fused._open_installed(stale)


class _DoubleSums:
    """A stand-in for ``amopt.torch._distributed.ScopeSync``: as if two ranks held
    identical halves of every scope (their sums add up to twice the local ones)."""

    needs_collective = True

    def __init__(self):
        self.calls = []

    def combine(self, sums, index):
        self.calls.append(([tuple(s.shape) for s in sums], index))
        return [2 * s for s in sums]


@pytest.mark.parametrize("per_layer", [True, False])
def test_sums_of_sharded_scopes_are_combined_between_reduce_and_rule(monkeypatch, per_layer):
    """With a sync plan: one combine for the step, and the rule sees the combined sums."""
    monkeypatch.setenv("AMOPT_FUSED_CHUNK_BYTES", "1")  # would be one chunk per tensor
    sizes = [40, 9, 300]
    seen = []
    rule = _rule.adam_beta

    def spy(xp, sums, cfg, **kw):
        seen.append(torch.as_tensor(np.array(sums)))  # NumPy, or torch for the collective
        return rule(xp, sums, cfg, **kw)

    monkeypatch.setattr(_rule, "adam_beta", spy)
    cfg = AMConfig.cached(lam=0.1, beta_max=0.9, numerator="linear", per_layer=per_layer)
    plain, synced = _adam_group(sizes), _adam_group(sizes)
    sync = _DoubleSums()
    grads = _grads_at(sizes)(0)
    hyper = AdamHyper(**ADAM_HYPER, config=cfg)
    _fused.fused_am_adamw(AdamTensors(*plain[:1], grads, *plain[2:]), hyper)
    _fused.fused_am_adamw(AdamTensors(*synced[:1], grads, *synced[2:]), hyper, sync=sync)
    local, combined = torch.cat([s.reshape(-1, 3) for s in seen[:-1]]), seen[-1].reshape(-1, 3)
    torch.testing.assert_close(combined, 2 * local, rtol=0, atol=0)
    rows = (3, 3) if per_layer else (3,)
    assert sync.calls == [([rows], [[0, 1, 2]] if per_layer else None)]


# --------------------------------------------------------------------------- float32 range


def _scaled_betas(cls, scale, **kwargs):
    """Betas of two float32 steps on gradients ``scale * g`` (the same g for every scale)."""
    gen = torch.Generator().manual_seed(11)
    params = [torch.randn(n, generator=gen) for n in (3000, 70)]
    grads = [[torch.randn(p.shape, generator=gen) * scale for p in params] for _ in range(2)]
    opt = cls([p.clone() for p in params], lr=1e-3, lam=0.0, fused=True, **kwargs)
    for step in grads:
        for p, g in zip(opt.param_groups[0]["params"], step, strict=True):
            p.grad = g
        opt.step()
    return torch.stack([b for row in opt.latest_betas() for b in row]).double()


# At lam = 0 (no weight decay) both rules are ratios of sums that scale alike with the
# gradients (AMSGD <g,g>/<v,v>; AM-Adam with eps scaled too, every term ~ |g|), and a
# power-of-two scale is exact in float: beta must not change. The float32 sums of a block
# carry a relative error of at most about (128 terms per lane) * 2^-24 ~ 8e-6 for these
# non-negative terms, and a ratio of two of them twice that: rtol 2e-5. Below 1e-19 the
# squares are subnormal (flushed to 0: beta was 0), above 1e19 they overflow.
@pytest.mark.parametrize("scale", [2.0**-80, 2.0**-70, 2.0**70, 2.0**80])
@pytest.mark.parametrize("per_layer", [True, False])
def test_amsgd_fused_beta_does_not_depend_on_the_gradient_scale(scale, per_layer):
    reference = _scaled_betas(AMSGD, 1.0, per_layer=per_layer)
    assert bool((reference > 0).all())
    torch.testing.assert_close(
        _scaled_betas(AMSGD, scale, per_layer=per_layer), reference, rtol=2e-5, atol=0
    )


# AM-Adam's state v = (1 - beta2) g^2 is itself float32 (as in torch.optim.AdamW), so only
# scales where v stays a normal float are meaningful: 2^-50 .. 2^60. Its beta sits at the
# cap here (N / D is about 1 at lam = 0), so the sums the rule receives are compared:
# every one of them is proportional to the scale.
@pytest.mark.parametrize("scale", [2.0**-50, 2.0**60])
def test_am_adamw_fused_sums_are_proportional_to_the_gradient_scale(monkeypatch, scale):
    seen = []
    rule = _rule.adam_beta

    def spy(xp, sums, cfg, **kw):
        seen.append(np.array(sums, dtype=np.float64))
        return rule(xp, sums, cfg, **kw)

    monkeypatch.setattr(_rule, "adam_beta", spy)
    _scaled_betas(AMAdamW, 1.0, eps=1e-8, weight_decay=0.0)
    reference, seen[:] = list(seen), []
    _scaled_betas(AMAdamW, scale, eps=1e-8 * scale, weight_decay=0.0)
    assert len(seen) == len(reference) > 0
    for got, want in zip(seen, reference, strict=True):
        assert np.all(np.isfinite(got)) and np.all(want > 0)
        np.testing.assert_allclose(got / scale, want, rtol=2e-5, atol=0)


# --------------------------------------------------------------------------- step counters


def test_step_counters_advance_in_their_own_dtype_with_adams_correction():
    """``am_advance_steps``: +1 per counter (float32 and float64 mixed), 1/(1 - beta2^t)."""
    steps = [torch.tensor(0.0), torch.tensor(6.0, dtype=torch.float64), torch.tensor(2.0**24)]
    before = [float(s) for s in steps]
    ib2 = np.empty(len(steps))
    _fused._check_steps(steps).advance(KERNELS, 0.999, ib2)
    # float32 2^24 + 1 rounds back to 2^24, as torch._foreach_add_ does in float32
    expected = [torch.tensor(b, dtype=s.dtype) + 1 for b, s in zip(before, steps, strict=True)]
    assert [s.dtype for s in steps] == [torch.float32, torch.float64, torch.float32]
    assert [float(s) for s in steps] == [float(e) for e in expected]
    t = np.array([float(s) for s in steps])
    np.testing.assert_allclose(ib2, 1.0 / (1.0 - 0.999**t), rtol=1e-13)


@pytest.mark.parametrize(
    "steps, reason",
    [
        ([torch.tensor(1.0, dtype=torch.float16)], "float32/float64 CPU scalars"),
        ([torch.zeros(2)], "float32/float64 CPU scalars"),
        ([torch.tensor(1)], "float32/float64 CPU scalars"),
    ],
)
def test_unusable_step_counters_name_the_cause(steps, reason):
    out = _fused._check_steps(steps)
    assert isinstance(out, str) and reason in out


@pytest.mark.parametrize(
    "arrays",
    [
        lambda: [[torch.zeros(3), torch.zeros(2, 2)], [torch.ones(3), torch.ones(2, 2)]],
        lambda: [[torch.zeros(3)], [torch.ones(3)], [None]],
        lambda: [[torch.nn.Parameter(torch.zeros(5).double())], [torch.ones(5).double()]],
        lambda: [[torch.zeros(4, dtype=torch.complex64)], [torch.ones(4, dtype=torch.complex64)]],
    ],
)
def test_the_quick_check_agrees_with_the_tensor_by_tensor_one(arrays):
    """Every step takes ``_check_common``; it must accept what ``_check_each`` accepts,
    with the same sizes and addresses (complex goes to ``_check_each``, seen as real)."""
    arrays = arrays()
    slow = _fused._check_each(arrays)
    fast = _fused._check_common(arrays)
    assert not isinstance(slow, str)
    if fast is None:
        assert arrays[0][0].is_complex()
        assert slow[1] == torch.float32 and slow[2] == [8]
        return
    assert fast[1:] == slow[1:]
