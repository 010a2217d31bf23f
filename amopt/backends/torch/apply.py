"""The AM momentum apply on torch CUDA tensors as one Triton kernel.

The counterpart of :mod:`amopt.backends.cupy.apply` for torch: in the pipelined loop of
:func:`amopt.minimize`, :math:`d_{t+1} = g_t + \\gamma_t (d_t - g_t)` and
:math:`x_{t+1} = x_t - \\eta\\, d_{t+1}` in one launch that reads :math:`x`, :math:`g`
and :math:`v = d - g` (or :math:`d`) and writes the new :math:`d` and :math:`x` (five
passes over memory where the tensor operations make ten). Compiled without contraction
into multiply-adds, every operation rounds once in float64, as torch's operations do:
their values bit for bit.

Contiguous float64 tensors on CUDA (CPU tensors under ``TRITON_INTERPRET=1`` when
:data:`amopt.backends.torch.rule.FORCE` asks), with ``gamma`` a 0-d float64 tensor (the device
rule's). float32 keeps the tensor operations: Triton may compile float32 arithmetic to
instructions that flush subnormal values to zero, which torch's kernels keep (float64
has no such mode). Anything else, or a kernel Triton cannot build (one warning per
process), keeps the tensor operations too.
"""

from __future__ import annotations

import functools
from typing import Any

from amopt import backends
from amopt.backends import triton as _triton
from amopt.backends.fallback import KernelCache
from amopt.backends.torch import rule as _torch_rule

__all__ = ["momentum_apply"]

#: elements per program
BLOCK = 1024

# set when the kernel is compiled (``_jitted``): the module imports without Triton
tl: Any = None


def _apply(
    x_ptr,
    g_ptr,
    w_ptr,
    c_ptr,
    dn_ptr,
    xn_ptr,
    n,
    lr: tl.float64,
    WITH_V: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    g = tl.load(g_ptr + offs, mask=m)
    w = tl.load(w_ptr + offs, mask=m)
    c = tl.load(c_ptr)
    if WITH_V:
        v = w
    else:
        v = w - g
    dn = g + c * v
    tl.store(dn_ptr + offs, dn, mask=m)
    tl.store(xn_ptr + offs, x - lr * dn, mask=m)


@functools.cache
def _jitted(interpret: bool) -> Any:
    """The kernel, compiled by ``triton.jit`` (interpreted under ``TRITON_INTERPRET``)."""
    global tl
    import triton
    import triton.language

    tl = triton.language
    return triton.jit(_apply)


#: whether the kernel failed (then never again here); the kernel itself is :func:`_jitted`
_KERNELS = KernelCache("the AM apply's Triton kernel", "the apply runs as tensor operations")


def momentum_apply(x: Any, g: Any, w: Any, coef: Any, lr: float, with_v: bool) -> Any:
    """``(d_new, x_new)`` of float64 torch tensors ``x``, ``g`` and ``w`` (``v = d - g``
    with ``with_v``, else ``d``), ``coef`` a 0-d float64 tensor; None where the apply is
    left to the tensor operations."""
    import torch

    if _KERNELS.off("apply") or x.dtype != torch.float64:
        return None
    if g.dtype != x.dtype or w.dtype != x.dtype or not isinstance(coef, torch.Tensor):
        return None
    if coef.dtype != x.dtype or coef.device != x.device or coef.numel() != 1:
        return None
    if not (x.is_contiguous() and g.is_contiguous() and w.is_contiguous()):
        return None
    if not (_torch_rule.applies(x) and backends.library_available("triton")):
        return None
    try:
        interpret = _triton.interpret()
        dn, xn = torch.empty_like(x), torch.empty_like(x)
        n = x.numel()
        options = {} if interpret else {"num_warps": 4, "enable_fp_fusion": False}
        _jitted(interpret)[((n + BLOCK - 1) // BLOCK,)](
            x, g, w, coef, dn, xn, n, float(lr), WITH_V=with_v, BLOCK=BLOCK, **options
        )
        return dn, xn
    except Exception as exc:  # noqa: BLE001 - a kernel Triton cannot build or run here
        _KERNELS.failed("apply", exc)
        return None
