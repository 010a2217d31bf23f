"""The AM momentum apply on CuPy arrays as one kernel: the new d and x in one pass.

The apply of an AM momentum step (``amopt.optimize.split.am_momentum_apply``) is

.. math::

    d_{t+1} = g_t + \\gamma_t (d_t - g_t), \\qquad x_{t+1} = x_t - \\eta\\, d_{t+1}.

As array operations that is four or five kernel launches and ten passes over memory
(each temporary written and read again); as one ``cupy.ElementwiseKernel`` it is one
launch that reads :math:`x`, :math:`g` and :math:`v = d - g` (or :math:`d`) and writes
:math:`d_{t+1}` and :math:`x_{t+1}`: five passes, what a hand-written heavy-ball step
moves. Every operation goes through its round-to-nearest intrinsic in the arrays'
dtype (``__dadd_rn``, ``__fmul_rn``, ...), which no compiler contracts into a fused
multiply-add: the values of the array operations bit for bit, in float64 and float32
(:func:`source`, compiled as C and compared in the tests).

Other dtypes, arrays of different dtypes, and a kernel CuPy cannot build (one warning
per process) are left to the array operations.
"""

from __future__ import annotations

from typing import Any

from amopt.backends.fallback import KernelCache

__all__ = ["momentum_apply", "source"]

#: the intrinsics' prefix by dtype name
_PREFIX = {"float64": "d", "float32": "f"}


def source(dtype: str, with_v: bool) -> str:
    """The kernel body for arrays of ``dtype`` (``"float64"`` or ``"float32"``): ``dn``
    and ``xn`` from ``x``, ``g``, the coefficient ``c``, the step size ``lr`` and either
    ``v = d - g`` (``with_v``) or ``d``."""
    p = _PREFIX[dtype]
    w = "v" if with_v else f"__{p}sub_rn(d, g)"
    return f"dn = __{p}add_rn(g, __{p}mul_rn(c, {w}));\nxn = __{p}sub_rn(x, __{p}mul_rn(lr, dn));"


#: kernels by (dtype name, with_v); None where none could be made
_KERNELS = KernelCache("the AM apply's fused CuPy kernel", "the apply runs as array operations")


def _build(dtype: str, with_v: bool) -> Any:
    import cupy

    third = "v" if with_v else "d"
    return cupy.ElementwiseKernel(
        f"{dtype} x, {dtype} g, {dtype} {third}, {dtype} c, {dtype} lr",
        f"{dtype} dn, {dtype} xn",
        source(dtype, with_v),
        f"amopt_am_momentum_apply_{dtype}_{third}",
    )


def _kernel(dtype: str, with_v: bool) -> Any:
    return _KERNELS.get((dtype, with_v), lambda: _build(dtype, with_v))


def momentum_apply(x: Any, g: Any, w: Any, coef: Any, lr: float, with_v: bool) -> Any:
    """``(d_new, x_new)`` of CuPy arrays ``x``, ``g`` and ``w`` (``v = d - g`` with
    ``with_v``, else ``d``) of one float dtype, ``coef`` a scalar or 0-d array of that
    dtype; None where the apply is left to the array operations."""
    dtype = str(x.dtype)
    if dtype not in _PREFIX or str(g.dtype) != dtype or str(w.dtype) != dtype:
        return None
    if getattr(coef, "dtype", None) is not None and str(coef.dtype) != dtype:
        return None
    key = (dtype, with_v)
    if _KERNELS.off(key):
        return None
    try:
        return _kernel(dtype, with_v)(x, g, w, coef, lr)
    except Exception as exc:  # noqa: BLE001 - a kernel CuPy cannot build or run
        _KERNELS.failed(key, exc)
        return None
