"""The fused CuPy rule kernel: its body, generated from the rule's tape, is the rule.

Without a GPU the kernel body (``amopt.backends.cupy.rule.source``) is compiled as C by the
machine's C compiler, the CUDA intrinsics it calls defined as the plain IEEE operations
they are (``__dadd_rn(a, b)`` is ``a + b`` rounded to nearest; contraction into fused
multiply-adds off, as the intrinsics guarantee on the device), and run over many
scopes' dots, edge cases included; the reference is the rule itself on float64 NumPy
sums. With CuPy and a GPU the kernel itself is compared the same way.
"""

from __future__ import annotations

import ctypes
import shutil
import warnings

import numpy as np
import pytest

from amopt.backends import library_available
from amopt.backends.cupy import rule as _cupy_rule
from amopt.core import rule as _rule
from amopt.core.config import AMConfig
from amopt.optimize import split as _split
from amopt.optimize import steps as _core

from _kernel_bodies import compile_library, same_bits

CC = shutil.which("cc") or shutil.which("gcc")

_PRELUDE = """
#include <string.h>
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __longlong_as_double(long long x) { double d; memcpy(&d, &x, 8); return d; }
void rule(const double* s, const double* fd, double* out_beta, double* out_gamma, long n) {
    for (long i = 0; i < n; ++i) {
        double beta, gamma;
"""
_POSTLUDE = """
        out_beta[i] = beta;
        out_gamma[i] = gamma;
    }
}
"""

CONFIGS = {
    "default": {},
    "lam": {"lam": 0.3, "beta_max": 0.95},
    "clip": {"variant": "clip", "beta_min": 0.4},
    "restart": {"variant": "restart", "theta": 0.6, "beta_high": 0.95, "beta_low": 0.05},
}


def _rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """Dots ``<v,v>, <g,g>, <v,g>`` of ``n`` scopes: random ones with
    ``|<v,g>| <= |v||g|``, and the rule's edge cases."""
    vv = 10.0 ** rng.uniform(-6, 6, n)
    gg = 10.0 ** rng.uniform(-6, 6, n)
    vg = rng.uniform(-1, 1, n) * np.sqrt(vv * gg)
    rows = np.stack([vv, gg, vg], axis=1)
    edges = [
        [0.0, 1.0, 0.0],  # d = g: degenerate
        [1e-40, 1.0, 1e-21],  # below the threshold
        [0.0, 0.0, 0.0],
        [np.inf, 1.0, 1.0],  # overflowed sums: NaN ratio
        [1e300, 1e300, -1e300],
        [np.nan, 1.0, 0.5],
        [1.0, np.nan, 0.5],
        [4.0, 1.0, -2.0],
        [1.0, 4.0, 2.0],
    ]
    return np.concatenate([rows, np.array(edges)])


def _reference(rows: np.ndarray, config, lr: float, fd) -> tuple[np.ndarray, np.ndarray]:
    """The rule on float64 NumPy sums formed as the host forms them, row by row."""
    exact = fd is not None
    betas, gammas = [], []
    with np.errstate(all="ignore"):
        for row in rows.tolist():
            sums = np.asarray(_split._momentum_sums_of(row, exact), dtype=np.float64)
            beta, gamma = _rule.momentum_beta(
                np, sums, config, lr=lr, f_decrease=None if fd is None else np.float64(fd)
            )
            betas.append(float(beta))
            gammas.append(float(gamma))
    return np.array(betas), np.array(gammas)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """``build(body) -> callable(rows, fd) -> (beta, gamma)``: the body compiled as C."""
    if CC is None:
        pytest.skip("no C compiler")
    folder = tmp_path_factory.mktemp("rule_c")  # private to this run
    count = [0]

    def build(body: str):
        count[0] += 1
        source = _PRELUDE + body + _POSTLUDE
        fn = compile_library(CC, folder, f"rule{count[0]}", source, ".c").rule
        ptr = ctypes.POINTER(ctypes.c_double)
        fn.argtypes = [ptr, ptr, ptr, ptr, ctypes.c_long]

        def run(rows: np.ndarray, fd):
            s = np.ascontiguousarray(rows, dtype=np.float64).reshape(-1)
            f = np.array([0.0 if fd is None else fd])
            beta, gamma = np.empty(len(rows)), np.empty(len(rows))
            fn(*(a.ctypes.data_as(ptr) for a in (s, f, beta, gamma)), len(rows))
            return beta, gamma

        return run

    return build


@pytest.mark.parametrize("fd", [None, 0.25, -3.0, 0.0])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_kernel_body_is_the_rule_bit_for_bit(compiled, name, fd):
    config = AMConfig.from_options(CONFIGS[name])
    lr = 0.05
    body = _cupy_rule.source(_rule.momentum_beta, config, lr, fd is not None)
    assert body is not None and "beta = r" in body and "gamma = r" in body
    rows = _rows(np.random.default_rng(7), 400)
    beta, gamma = compiled(body)(rows, fd)
    want_beta, want_gamma = _reference(rows, config, lr, fd)
    same_bits(beta, want_beta)
    same_bits(gamma, want_gamma)
    # the edge rows: degenerate and overflowed sums give beta 0 before the variant
    if name == "default":
        assert np.all(beta[-9:-6] == 0.0) and beta[-6] == 0.0


def test_the_body_uses_no_contractible_arithmetic():
    """Every product and sum goes through an intrinsic (no bare ``*``, ``+``, ``-``
    between operands a compiler could fuse)."""
    config = AMConfig.from_options({"lam": 0.3})
    body = _cupy_rule.source(_rule.momentum_beta, config, 0.1, True)
    for line in body.splitlines():
        rhs = line.split("=", 1)[1]
        if "?" in rhs or "__" in rhs or "s[" in rhs:  # selections, intrinsics, inputs
            continue
        assert not any(op in rhs for op in (" * ", " + ", " / ")), line


def test_a_rule_that_cannot_be_recorded_is_left_to_the_arrays():
    def branching(xp, sums, cfg, *, lr=None, f_decrease=None):
        if float(sums[..., 0]) > 0:  # a Python branch on a value: not recordable
            return sums[..., 0], sums[..., 1]
        return sums[..., 1], sums[..., 0]

    config = AMConfig.from_options({})
    assert _cupy_rule.source(branching, config, 0.1, False) is None


# --------------------------------------------------------------------------- GPU


@pytest.mark.skipif(not library_available("cupy"), reason="needs CuPy and a GPU")
@pytest.mark.parametrize("fd", [None, 0.25])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_cupy_kernel_is_the_rule_bit_for_bit(name, fd):
    import cupy

    config = AMConfig.from_options(CONFIGS[name])
    rows = _rows(np.random.default_rng(8), 200)
    sums = [cupy.asarray(v) for v in rows.reshape(-1)]
    f_dec = None if fd is None else cupy.asarray(fd)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a kernel that fails to build is a failure here
        out = _cupy_rule.momentum_rule(_rule.momentum_beta, sums, config, 0.05, f_dec)
    assert out is not None
    want_beta, want_gamma = _reference(rows, config, 0.05, fd)
    same_bits(cupy.asnumpy(out[0]), want_beta)
    same_bits(cupy.asnumpy(out[1]), want_gamma)


def test_a_cupy_step_applies_the_kernels_coefficients(monkeypatch):
    """``am_momentum_apply`` on CuPy's namespace hands the dots to the kernel and applies
    its gamma (NumPy arrays and a module named cupy stand in for CuPy here)."""
    import types

    import array_api_compat.numpy as npx

    fake_cupy = types.ModuleType("cupy")
    monkeypatch.setattr(_split, "plain_namespace", lambda xp: fake_cupy)
    calls = []

    def kernel(rule, sums, config, lr, f_decrease):
        calls.append((rule, len(sums), lr, f_decrease))
        return np.array([0.5]), np.array([0.25])  # beta, gamma of the one scope

    monkeypatch.setattr(_cupy_rule, "momentum_rule", kernel)
    config = AMConfig.from_options({})
    x, g, d = np.array([1.0, 2.0]), np.array([0.5, -1.0]), np.array([1.5, 1.0])
    state = _core.AMState(3, (d,), np.float64(2.0), True)
    pending = ((d,), (d - g,), False, npx)
    sums = [np.asarray(v) for v in ((d - g) @ (d - g), g @ g, (d - g) @ g)]
    new_x, new_state, beta = _split.am_momentum_apply(
        x, g, state, pending, sums, lr=0.1, f=np.float64(1.0), config=config
    )
    assert calls == [(_rule.momentum_beta, 3, 0.1, None)]
    np.testing.assert_array_equal(new_state.d[0], g + 0.25 * (d - g))
    np.testing.assert_array_equal(new_x, x - 0.1 * (g + 0.25 * (d - g)))
    assert float(beta) == 0.5
