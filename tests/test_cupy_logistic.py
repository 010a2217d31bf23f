"""The fused CuPy kernel of the binary logistic loss: CuPy's array operations, bit for bit.

Without a GPU the kernel body (``amopt.backends.cupy.logistic.source``) is compiled as
C++ (the CUDA intrinsics defined as the IEEE operations they are, no contraction), and
compared with the array operations it replaces, ``-(t * z)``, CuPy's ``logaddexp``
expression, ``exp`` and the products, transcribed value by value with the same C math
library's ``exp`` and ``log1p`` (CUDA's are another library: on a GPU the kernel is
compared with CuPy's own array operations instead).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import shutil

import numpy as np
import pytest

from amopt.backends import library_available
from amopt.backends.cupy import logistic as _cupy_logistic
from amopt.problems import LogisticRegression

from _kernel_bodies import INTRINSICS, compile_library, same_bits

CXX = shutil.which("c++") or shutil.which("g++")
LIBM = ctypes.util.find_library("m")

_PRELUDE = (
    """
#include <cmath>
using std::exp; using std::log; using std::log1p; using std::fmax; using std::fabs;
"""
    + INTRINSICS
)


def _function(dtype: str) -> str:
    t = "double" if dtype == "float64" else "float"
    return (
        f'extern "C" void run_{dtype}(const {t}* ts, const {t}* zs, {t}* losses, {t}* ss, '
        f"long n) {{\n    for (long i = 0; i < n; ++i) {{\n"
        f"        const {t} t = ts[i], z = zs[i];\n        {t} loss, s;\n"
        f"        {_cupy_logistic.source(dtype)}\n"
        f"        losses[i] = loss; ss[i] = s;\n    }}\n}}\n"
    )


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    if CXX is None or LIBM is None:
        pytest.skip("no C++ compiler or C math library")
    folder = tmp_path_factory.mktemp("logistic_cxx")  # private to this run
    source = _PRELUDE + _function("float64") + _function("float32")
    dll = compile_library(CXX, folder, "logistic", source, ".cpp")

    def get(dtype: str):
        fn = getattr(dll, f"run_{dtype}")
        ptr = ctypes.POINTER(ctypes.c_double if dtype == "float64" else ctypes.c_float)
        fn.argtypes = [ptr, ptr, ptr, ptr, ctypes.c_long]

        def run(t, z):
            loss, s = np.empty_like(z), np.empty_like(z)
            fn(*(a.ctypes.data_as(ptr) for a in (t, z, loss, s)), z.size)
            return loss, s

        return run

    return get


def _reference(dtype: str, t: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The array operations value by value: products and differences in ``dtype``,
    ``exp``, ``log1p`` and ``log`` from the C math library, CuPy's ``logaddexp`` (its
    branch for equal inputs included)."""
    libm = ctypes.CDLL(LIBM)
    ct = ctypes.c_double if dtype == "float64" else ctypes.c_float
    suffix = "" if dtype == "float64" else "f"
    exp, log1p = getattr(libm, "exp" + suffix), getattr(libm, "log1p" + suffix)
    for fn in (exp, log1p):
        fn.argtypes, fn.restype = [ct], ct
    libm.log.argtypes, libm.log.restype = [ctypes.c_double], ctypes.c_double
    log2 = libm.log(2.0)
    T = np.dtype(dtype).type
    zero = T(0)
    losses, ss = [], []
    with np.errstate(all="ignore"):
        for ti, zi in zip(t, z, strict=True):
            nm = -(ti * zi)
            if zero == nm:  # CuPy's logaddexp of equal inputs: in0 + log(2.0), in double
                loss = T(float(zero) + log2)
            else:
                big = zero if np.isnan(nm) else max(zero, nm)  # C's fmax: NaN loses
                loss = T(big + T(log1p(T(exp(T(-abs(zero - nm)))))))
            losses.append(loss)
            ss.append(T(ti * T(exp(T(nm - loss)))))
    return np.array(losses, dtype=dtype), np.array(ss, dtype=dtype)


def _inputs(dtype: str, n: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    t = rng.choice([-1.0, 1.0], n).astype(dtype)
    z = (rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 3, n)).astype(dtype)
    z[:7] = [0.0, -0.0, np.inf, -np.inf, np.nan, 800.0, -800.0]
    return t, z


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_kernel_body_is_the_array_operations(compiled, dtype):
    t, z = _inputs(dtype)
    loss, s = compiled(dtype)(t, z)
    want_loss, want_s = _reference(dtype, t, z)
    same_bits(loss, want_loss)
    same_bits(s, want_s)
    # and they are the logistic loss and residual (NumPy's own functions, to rounding)
    finite = np.isfinite(z)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(
            loss[finite], np.logaddexp(0, -(t * z))[finite], rtol=8 * np.finfo(dtype).eps
        )


def test_other_dtypes_are_left_to_the_array_operations():
    h = np.ones(3, dtype=np.float16)
    assert _cupy_logistic.loss_and_residual(h, h) is None
    assert _cupy_logistic.loss_and_residual(np.ones(3), np.ones(3, dtype=np.float32)) is None


# --------------------------------------------------------------------------- GPU


@pytest.mark.skipif(not library_available("cupy"), reason="needs CuPy and a GPU")
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_cupy_kernel_is_cupys_array_operations_bit_for_bit(dtype):
    import warnings

    import cupy

    t, z = (cupy.asarray(a) for a in _inputs(dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a kernel that fails to build is a failure here
        out = _cupy_logistic.loss_and_residual(t, z)
    assert out is not None
    neg_margin = -(t * z)
    loss = cupy.logaddexp(cupy.zeros((), dtype=dtype), neg_margin)
    s = t * cupy.exp(neg_margin - loss)
    same_bits(cupy.asnumpy(out[0]), cupy.asnumpy(loss))
    same_bits(cupy.asnumpy(out[1]), cupy.asnumpy(s))


@pytest.mark.skipif(not library_available("cupy"), reason="needs CuPy and a GPU")
def test_a_cupy_logistic_regression_is_the_numpy_one():
    import cupy

    rng = np.random.default_rng(2)
    X = rng.standard_normal((300, 12))
    y = np.where(X @ rng.standard_normal(12) > 0, 1.0, -1.0)
    prob = LogisticRegression(X, y, l2=1e-3)
    x = rng.standard_normal(12)
    f, g = prob.value_and_grad(x)
    f_c, g_c = prob.value_and_grad(cupy.asarray(x))
    np.testing.assert_allclose(float(f_c), f, rtol=1e-13)
    np.testing.assert_allclose(cupy.asnumpy(g_c), g, rtol=1e-12, atol=1e-15)
