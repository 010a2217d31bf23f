"""Beta over the whole range of each floating dtype: finite, in range, and scale-invariant.

At ``lam = 0`` the linearised rule ``beta = <g,g> / |d-g|^2`` depends only on the
direction of ``(g, d)``: scaling both by ``s`` must not change it. In float32 the
squares themselves underflow for ``|g|`` below about 1e-19 and overflow above about
1e19; the sums are accumulated in float64, so beta is the same at every scale the
dtype can hold.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import amopt


def _pair(dtype, scale, seed=0):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(64)
    d = g + 2.0 * rng.standard_normal(64)
    return (scale * g).astype(dtype), (scale * d).astype(dtype)


@pytest.mark.parametrize("scale", [1e-30, 1e-23, 1e-15, 1e15, 1e19, 1e30])
def test_float32_beta_is_scale_invariant(scale):
    g1, d1 = _pair(np.float32, 1.0)
    gs, ds = _pair(np.float32, scale)
    # the reference: the same float32 numbers, scaled back exactly in float64
    ref = float(amopt.am_beta(gs.astype(np.float64) / scale, ds.astype(np.float64) / scale))
    got = float(amopt.am_beta(gs, ds, lam=0.0, beta_max=1.0))
    assert 0.0 < ref < 1.0
    # float32 inputs scaled by s differ from the unscaled ones by one rounding each
    np.testing.assert_allclose(got, ref, rtol=8 * np.finfo(np.float32).eps)
    np.testing.assert_allclose(got, float(amopt.am_beta(g1, d1)), rtol=1e-5)


@pytest.mark.parametrize("scale", [1e-30, 1e25])
def test_float32_am_adam_beta_is_scale_invariant_at_lam_0(scale):
    g1, d1 = _pair(np.float32, 1.0)
    gs, ds = _pair(np.float32, scale)
    p1 = np.abs(g1) + 1.0
    ps = (scale * p1).astype(np.float32)  # p scales like |g| (no eps)
    x = np.zeros_like(g1)
    one = float(amopt.am_adam_beta(g1, d1, x, p1, lr=0.1, lam=0.0, beta_max=1.0))
    big = float(amopt.am_adam_beta(gs, ds, x, ps, lr=0.1, lam=0.0, beta_max=1.0))
    assert 0.0 < one < 1.0
    np.testing.assert_allclose(big, one, rtol=1e-5)


def test_float32_momentum_step_keeps_adapting_at_tiny_gradients():
    x = np.full(8, 1e-25, dtype=np.float32)
    state = amopt.am_momentum_init(x)
    betas = []
    for t in range(4):
        g = (x * np.linspace(1.0, 2.0, 8, dtype=np.float32) + np.float32(1e-26 * t)).astype(
            np.float32
        )
        x, state, beta = amopt.am_momentum_step(x, g, state, lr=0.1, numerator="linear")
        betas.append(float(beta))
    # the same run at scale 1
    y = np.full(8, 1.0, dtype=np.float32)
    s1 = amopt.am_momentum_init(y)
    ref = []
    for t in range(4):
        g = (y * np.linspace(1.0, 2.0, 8, dtype=np.float32) + np.float32(0.1 * t)).astype(
            np.float32
        )
        y, s1, beta = amopt.am_momentum_step(y, g, s1, lr=0.1, numerator="linear")
        ref.append(float(beta))
    assert any(b > 0 for b in ref[1:])
    np.testing.assert_allclose(betas, ref, rtol=1e-4)


_DTYPES = ["float16", "float32", "float64", "bfloat16"]


def _as_array(values: np.ndarray, dtype: str):
    if dtype == "bfloat16":
        return torch.from_numpy(values).to(torch.bfloat16)
    return values.astype(dtype)


def _range(dtype: str) -> tuple[float, float]:
    info = torch.finfo(torch.bfloat16) if dtype == "bfloat16" else np.finfo(dtype)
    return float(info.smallest_normal), float(info.max)


@settings(max_examples=150, deadline=None)
@given(
    dtype=st.sampled_from(_DTYPES),
    exponent=st.floats(-30.0, 30.0),
    seed=st.integers(0, 2**16),
    lam=st.sampled_from([0.0, 0.1]),
    beta_max=st.sampled_from([0.9, 1.0]),
)
def test_beta_finite_and_in_range_across_scales(dtype, exponent, seed, lam, beta_max):
    lo, hi = _range(dtype)
    scale = min(max(10.0**exponent, lo * 1e3), hi / 1e3)
    rng = np.random.default_rng(seed)
    g = _as_array(scale * rng.standard_normal(16), dtype)
    d = _as_array(scale * rng.standard_normal(16), dtype)
    beta = float(amopt.am_beta(g, d, lam=lam, beta_max=beta_max))
    assert np.isfinite(beta) and 0.0 <= beta <= beta_max
    p = _as_array(np.abs(scale * rng.standard_normal(16)) + scale, dtype)
    x = _as_array(rng.standard_normal(16), dtype)
    beta = float(amopt.am_adam_beta(g, d, x, p, lr=1e-3, lam=lam, beta_max=beta_max))
    assert np.isfinite(beta) and 0.0 <= beta <= beta_max


def test_heavy_ball_state_does_not_alias_the_callers_gradient():
    """The first step's buffer is a copy: reusing the gradient array changes nothing."""
    x = np.array([1.0, -2.0])
    g = np.array([0.5, 0.25])
    x1, state = amopt.heavy_ball_step(x, g, amopt.heavy_ball_init(x), lr=0.1, beta=0.9)
    g[:] = 100.0  # the caller reuses its buffer for the next gradient
    np.testing.assert_array_equal(state.d[0], [0.5, 0.25])
    g2 = np.array([1.0, 1.0])
    x2, _ = amopt.heavy_ball_step(x1, g2, state, lr=0.1, beta=0.9)
    np.testing.assert_allclose(x2, x1 - 0.1 * (0.9 * np.array([0.5, 0.25]) + 0.1 * g2))
