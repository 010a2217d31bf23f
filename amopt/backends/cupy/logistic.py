"""The binary logistic loss and its residual on CuPy arrays in one kernel.

:class:`~amopt.problems.LogisticRegression` evaluates, from the labels :math:`b` and the
scores :math:`z = A x`,

.. math::

    \\ell = \\log(1 + e^{-b z}) = \\operatorname{logaddexp}(0, -b z), \\qquad
    s = b\\, e^{-b z - \\ell} = b\\, \\sigma(-b z),

the losses that sum to :math:`f` and the residual whose :math:`A^\\top s` is the
gradient. As CuPy array operations that is six kernel launches (a product, a negation,
``logaddexp``, a difference, ``exp``, a product); on a mini-batch of a few hundred rows
each launch costs more host time than its arithmetic, so here they are one
``cupy.ElementwiseKernel``. It runs the same operations as those launches: CuPy's own
``logaddexp`` (``a + log(2.0)`` in double where ``a == b``, else ``fmax(a, b) +
log1p(exp(-fabs(a - b)))``), the same CUDA
math functions, and the products and differences through their round-to-nearest
intrinsics, which no compiler contracts into a fused multiply-add: the array
operations' values bit for bit (compared on a GPU in the tests; without one, the body is
compiled as C++ and compared with a NumPy transcription of those operations).

Other dtypes, or labels and scores of two dtypes, keep the array operations, as does a
kernel CuPy cannot build (one warning per process).
"""

from __future__ import annotations

from typing import Any

from amopt.backends.fallback import KernelCache

__all__ = ["loss_and_residual", "source"]

_TYPES = {"float64": ("d", "double"), "float32": ("f", "float")}


def source(dtype: str) -> str:
    """The kernel body for ``dtype`` (``"float64"`` or ``"float32"``): ``loss`` and ``s``
    from the labels ``t`` and the scores ``z``."""
    p, c = _TYPES[dtype]
    return (
        f"const {c} zero = 0;\n"
        f"const {c} nm = -__{p}mul_rn(t, z);\n"
        # CuPy's logaddexp(in0, in1): in0 + log(2.0) where in0 == in1, in double
        f"if (zero == nm) {{\n    loss = zero + log(2.0);\n}} else {{\n"
        f"    loss = __{p}add_rn(fmax(zero, nm), log1p(exp(-fabs(__{p}sub_rn(zero, nm)))));\n"
        "}\n"
        f"s = __{p}mul_rn(t, exp(__{p}sub_rn(nm, loss)));"
    )


#: kernels by dtype name; None where none could be made
_KERNELS = KernelCache("the logistic loss's fused CuPy kernel", "it runs as array operations")


def _build(dtype: str) -> Any:
    import cupy

    return cupy.ElementwiseKernel(
        f"{dtype} t, {dtype} z",
        f"{dtype} loss, {dtype} s",
        source(dtype),
        f"amopt_logistic_loss_residual_{dtype}",
    )


def _kernel(dtype: str) -> Any:
    return _KERNELS.get(dtype, lambda: _build(dtype))


def loss_and_residual(t: Any, z: Any) -> Any:
    """``(loss, s)`` of CuPy labels ``t`` and scores ``z`` of one float dtype (see the
    module docstring); None where they are left to the array operations."""
    dtype = str(z.dtype)
    if dtype not in _TYPES or str(t.dtype) != dtype or _KERNELS.off(dtype):
        return None
    try:
        return _kernel(dtype)(t, z)
    except Exception as exc:  # noqa: BLE001 - a kernel CuPy cannot build or run
        _KERNELS.failed(dtype, exc)
        return None
