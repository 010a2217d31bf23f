"""The fused CuPy apply of an AM momentum step: the array operations' values, bit for bit.

Without a GPU the kernel body (``amopt.backends.cupy.apply.source``) is compiled as C by the
machine's C compiler, the CUDA intrinsics it calls defined as the plain IEEE operations
they are (``__fmul_rn(a, b)`` is ``a * b`` rounded to nearest in float32; contraction
into fused multiply-adds off, as the intrinsics guarantee on the device), and compared
with NumPy's ``g + c * v`` and ``x - lr * d`` on the same arrays, edge values included.
With CuPy and a GPU the kernel itself is compared with CuPy's array operations.
"""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from amopt import backends
from amopt.backends import library_available
from amopt.backends.cupy import apply as _cupy_apply
from amopt.core.config import AMConfig
from amopt.optimize import split as _split
from amopt.optimize import steps as _core

from _kernel_bodies import INTRINSICS, compile_library, same_bits

CC = shutil.which("cc") or shutil.which("gcc")


def _c_function(dtype: str, with_v: bool) -> str:
    t = "double" if dtype == "float64" else "float"
    third = "v" if with_v else "d"
    return (
        f"void apply_{dtype}_{third}(const {t}* xs, const {t}* gs, const {t}* ws, {t} c, "
        f"{t} lr, {t}* dns, {t}* xns, long n) {{\n"
        f"    for (long i = 0; i < n; ++i) {{\n"
        f"        {t} x = xs[i], g = gs[i], {third} = ws[i], dn, xn;\n"
        f"        {_cupy_apply.source(dtype, with_v)}\n"
        f"        dns[i] = dn; xns[i] = xn;\n"
        f"    }}\n}}\n"
    )


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """``(dtype, with_v) -> callable(x, g, w, c, lr) -> (dn, xn)``: the bodies as C."""
    if CC is None:
        pytest.skip("no C compiler")
    folder = tmp_path_factory.mktemp("apply_c")  # private to this run
    cases = [(dt, v) for dt in ("float64", "float32") for v in (True, False)]
    source = INTRINSICS + "".join(_c_function(dt, v) for dt, v in cases)
    dll = compile_library(CC, folder, "apply", source, ".c")

    def get(dtype: str, with_v: bool):
        fn = getattr(dll, f"apply_{dtype}_{'v' if with_v else 'd'}")
        ct = ctypes.c_double if dtype == "float64" else ctypes.c_float
        ptr = ctypes.POINTER(ct)
        fn.argtypes = [ptr, ptr, ptr, ct, ct, ptr, ptr, ctypes.c_long]

        def run(x, g, w, c, lr):
            dn, xn = np.empty_like(x), np.empty_like(x)
            arrays = [np.ascontiguousarray(a) for a in (x, g, w)]
            fn(*(a.ctypes.data_as(ptr) for a in arrays), c, lr,
               dn.ctypes.data_as(ptr), xn.ctypes.data_as(ptr), x.size)  # fmt: skip
            return dn, xn

        return run

    return get


def _arrays(dtype: str, n: int = 4000) -> tuple[np.ndarray, ...]:
    """``x``, ``g``, ``d`` of ``dtype`` over many magnitudes, with infinities, NaNs and
    subnormals among them."""
    rng = np.random.default_rng(5)
    info = np.finfo(dtype)
    out = []
    for _ in range(3):
        a = rng.standard_normal(n) * 10.0 ** rng.uniform(-8, 8, n)
        a[:6] = [np.inf, -np.inf, np.nan, float(info.tiny) / 8, float(info.max), 0.0]
        out.append(rng.permutation(a).astype(dtype))
    return tuple(out)


@pytest.mark.parametrize("with_v", [True, False])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("coef", [0.0, 0.37, 1.0, -2.5])
def test_the_kernel_body_is_the_array_operations_bit_for_bit(compiled, dtype, with_v, coef):
    x, g, d = _arrays(dtype)
    c, lr = np.dtype(dtype).type(coef), 0.0731
    with np.errstate(all="ignore"):
        v = d - g
        want_d = g + c * v  # the array operations of amopt.optimize.split.am_momentum_apply
        want_x = x - lr * want_d
        dn, xn = compiled(dtype, with_v)(x, g, v if with_v else d, c, np.dtype(dtype).type(lr))
    same_bits(dn, want_d)
    same_bits(xn, want_x)


def test_the_body_uses_no_contractible_arithmetic():
    """Every product, sum and difference goes through an intrinsic."""
    for dtype in ("float64", "float32"):
        for with_v in (True, False):
            for line in _cupy_apply.source(dtype, with_v).splitlines():
                rhs = line.split("=", 1)[1]
                stripped = rhs.replace("_rn(", "(")
                assert not any(op in stripped for op in (" * ", " + ", " - ")), line


def test_other_dtypes_are_left_to_the_array_operations():
    """float16, or arrays of two dtypes: no kernel (decided before CuPy is imported)."""
    h = np.ones(3, dtype=np.float16)
    assert _cupy_apply.momentum_apply(h, h, h, 0.5, 0.1, True) is None
    a, b = np.ones(3), np.ones(3, dtype=np.float32)
    assert _cupy_apply.momentum_apply(a, b, a, 0.5, 0.1, True) is None
    assert _cupy_apply.momentum_apply(b, b, b, np.float64(0.5), 0.1, True) is None


@pytest.mark.parametrize("fused", [False, True])
def test_a_cupy_step_hands_its_apply_to_the_kernel(monkeypatch, fused):
    """On CuPy arrays (NumPy ones standing in, recognised as CuPy's) the apply goes to
    the kernel with each array's own ``v`` or ``d``; where the kernel declines, the
    array operations give the same values."""
    calls = []

    def kernel(x, g, w, coef, lr, with_v):
        calls.append(with_v)
        if not fused:
            return None
        return g + coef * (w if with_v else w - g), x - lr * (g + coef * (w if with_v else w - g))

    monkeypatch.setattr(backends, "library_of", lambda a: "cupy")
    monkeypatch.setattr(_cupy_apply, "momentum_apply", kernel)
    config = AMConfig.from_options({"per_layer": True})
    xs = (np.array([1.0, 2.0]), np.array([0.5, -1.0, 3.0], dtype=np.float32))
    gs = (np.array([0.5, -1.0]), np.array([0.25, 1.0, -2.0], dtype=np.float32))
    state = _core.AMState(3, (np.array([1.5, 1.0]), np.array([1.0, 0.5, 0.0], np.float32)),
                          np.float64(2.0), True)  # fmt: skip
    pending, sums = _split.am_momentum_sums(xs, gs, state, config=config)
    values = [float(s) for s in sums]
    new_x, new_state, betas = _split.am_momentum_apply(
        xs, gs, state, pending, values, lr=0.1, f=np.float64(1.0), config=config
    )
    # float64 arrays keep their v from the sums; float32 ones too (their sums' dtype)
    assert calls == [pending[1][0] is not None, pending[1][1] is not None]
    monkeypatch.undo()
    want_x, want_state, want_betas = _split.am_momentum_apply(
        xs, gs, state, pending, values, lr=0.1, f=np.float64(1.0), config=config
    )
    for a, b in zip(new_x, want_x, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(new_state.d, want_state.d, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(betas, want_betas)


# --------------------------------------------------------------------------- GPU


@pytest.mark.skipif(not library_available("cupy"), reason="needs CuPy and a GPU")
@pytest.mark.parametrize("with_v", [True, False])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_cupy_kernel_is_the_array_operations_bit_for_bit(dtype, with_v):
    import warnings

    import cupy

    x, g, d = (cupy.asarray(a) for a in _arrays(dtype))
    c = cupy.asarray(np.dtype(dtype).type(0.37))
    v = d - g
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a kernel that fails to build is a failure here
        out = _cupy_apply.momentum_apply(x, g, v if with_v else d, c, 0.0731, with_v)
    assert out is not None
    want_d = g + c * v
    want_x = x - 0.0731 * want_d
    same_bits(cupy.asnumpy(out[0]), cupy.asnumpy(want_d))
    same_bits(cupy.asnumpy(out[1]), cupy.asnumpy(want_x))
