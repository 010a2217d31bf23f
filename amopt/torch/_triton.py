r"""Triton kernels for the AM optimizers on the GPU: multi-tensor reduce -> rule -> apply.

One optimizer step over a param group is the reduce -> rule -> apply of
:mod:`amopt.core.rule` in five device stages (the linearised numerator: the
stochastic form of the rules, as the optimizers use it):

1. **reduce** (one launch per parameter dtype, over every tensor of the group):
   each program reads one chunk of one tensor and writes the chunk's partial
   sums of the rule (:data:`amopt.core.rule.MOMENTUM_SUMS` ``vv, gg, dd`` for AMSGD,
   :data:`amopt.core.rule.ADAM_SUMS` ``num, den, ref`` for AMAdamW) to one row of a
   partial-sums array, accumulated in float32 (float64 for float64 scopes);
2. **segment sum**: one program per beta scope adds its rows in a fixed order
   (deterministic, no atomics), giving the stacked sums, shape ``(n_scopes, 3)``;
3. **rule**: :func:`amopt.core.rule.momentum_beta` / :func:`amopt.core.rule.adam_beta`
   with ``xp=torch`` on those sums, on the device;
4. **apply** (one launch per dtype): the momentum and parameter update;
5. the step counters (and, on a skipped step, nothing else) are updated.

The kernels find the tensors through a table of their addresses, element
counts and scope indices, and a block map (tensor, chunk, partial-sums row), as
``torch``'s multi-tensor apply does. Whole chunks run without masks and, when
every tensor is 16-byte aligned, with vector loads; the last partial chunk of
each tensor runs in a second, masked launch. Arithmetic is float32 for
float16 / bfloat16 / float32 parameters (float64 for float64); the state
(``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``) is kept in the parameter
dtype, as in ``torch.optim.AdamW(fused=True)``.

No device value is read on the host: the rule runs on the device, and the
address tables and block maps are built from the tensors' metadata once, into a
:class:`Plan` (cached by the tensors' addresses for the functional drivers; a step
whose gradients alone moved rewrites their addresses in the cached plan). The
optimizers keep one :class:`GroupPlan` per param group: their per-parameter ``step``,
``beta`` and ``beta1_prod`` entries become views of group-level device tensors
(:class:`GroupState`), so that a step is a fixed number of launches and small
device operations whatever the number of tensors, and no host-to-device copy
(gradients reallocated by ``zero_grad()`` cost a comparison of their addresses and,
where they moved, one asynchronous copy of the rewritten address tables). Sharded
groups are planned over their local tensors, and their steps add the sums of each
scope over its ranks between the reduce and the rule. Host data
a step needs on the device (address tables when a plan is built, host step
counters) is copied from page-locked memory without blocking.
Under ``torch.compile`` the drivers run inside the custom operators of
``amopt.torch._fused_ops`` (one node of the graph; with per-layer scopes the operator
stores each parameter's beta and product itself, so that the graph's operations do
not grow with the number of tensors).
GradScaler's fused protocol is supported: ``grad_scale`` divides the gradients
inside the kernels, and ``found_inf`` (nonzero) masks every store, keeps the
running products :math:`\pi` and leaves the step counters as they were. Step
counters may be CPU tensors (as the optimizers keep them) or device tensors.
The one exception to the rule above: with CPU counters and ``found_inf`` on the
GPU, the counters are put back with ``found_inf`` read on the host (one
synchronisation, on the steps GradScaler drives); device counters avoid it.

Triton is imported when a step first runs, so that ``amopt`` imports without
it. With ``TRITON_INTERPRET=1`` the kernels run on CPU tensors through Triton's
interpreter (slowly; this is how the tests check them without a GPU).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import warnings
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from amopt import backends
from amopt.backends import triton as _emit
from amopt.backends.torch import rule as _torch_rule
from amopt.core import rule as _rule
from amopt.core import tape as _tape
from amopt.core.config import AMConfig, check_bool, check_choice, check_nonnegative
from amopt.torch import _eager
from amopt.torch._records import (
    NO_SCALER,
    AdamHyper,
    AdamTensors,
    Scaler,
    SGDHyper,
    SGDTensors,
    Sharded,
    kept_copy,
    kept_empty,
    staged,
)

if TYPE_CHECKING:
    import triton.language as tl
else:
    tl = None  # triton.language, bound on first use (the kernels' annotations name it)

__all__ = ["available", "triton_am_adamw", "triton_amsgd"]

#: Elements per tile (one vector of a program) and per program (chunk).
BLOCK = 1024
CHUNK = 16 * 1024
NUM_WARPS = 4
#: Rows of partial sums read per iteration of the segment sum.
SEGMENT_ROWS = 128
_K = 3  # sums per scope, for both rules

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_SGD_COLUMNS = 6  # x, g, d addresses, numel, scope, tensor index
_ADAM_COLUMNS = 7  # x, g, d, v addresses, numel, scope, tensor index


# --------------------------------------------------------------------------- availability


def _interpret() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET``).

    A constant of a compiled graph: newer Triton reads the variable in C++, which
    Dynamo cannot trace, and the optimizers ask (through :func:`available`) while
    ``torch.compile`` traces their step. (Decorated on first traced use, see
    :mod:`amopt.torch._eager`: the decorator imports the compiler.)
    """
    if torch.compiler.is_compiling():
        return _eager.triton_interpret()
    return _interpret_eagerly()


def _interpret_eagerly() -> bool:
    if not backends.library_available("triton"):
        return False
    return _torch_rule._interpret()


_eager.register("triton_interpret", "assume_constant_result", _interpret_eagerly)


def available(tensors: Iterable[Tensor]) -> str | None:
    """Whether the Triton kernels can step these tensors.

    Parameters
    ----------
    tensors : iterable of Tensor
        Every tensor of the step: parameters, gradients and state.

    Returns
    -------
    str or None
        ``None`` if the kernels can run, else the reason they cannot: Triton is
        not installed, the tensors are not CUDA tensors on one device (CPU
        tensors are accepted only under ``TRITON_INTERPRET=1``), a dtype other
        than float16, bfloat16, float32 or float64, or a sparse or
        non-contiguous tensor.

    Examples
    --------
    >>> import torch
    >>> from amopt.torch._triton import available
    >>> available([torch.zeros(3, dtype=torch.int64)]) is not None
    True
    """
    # whether Triton imports is the registry's answer, probed once per process
    if not backends.library_available("triton"):
        return "triton is not installed (or does not import)"
    interpret = _interpret()
    device = None
    for t in tensors:
        if not isinstance(t, Tensor):
            return f"expected tensors, got {type(t).__name__}"
        if t.layout != torch.strided:
            return f"sparse tensors are not supported (layout {t.layout})"
        if device is None:
            device = t.device
        elif t.device != device:
            return f"the tensors are on more than one device ({device} and {t.device})"
        if t.device.type != "cuda" and not (t.device.type == "cpu" and interpret):
            return (
                f"tensors on {t.device}: the Triton kernels need CUDA tensors "
                "(CPU tensors only with TRITON_INTERPRET=1)"
            )
        if t.dtype not in _DTYPES:
            return f"dtype {t.dtype} is not supported (float16, bfloat16, float32, float64)"
        if not t.is_contiguous():
            return f"a non-contiguous tensor (shape {tuple(t.shape)}, strides {t.stride()})"
    return None


# --------------------------------------------------------------------------- kernels
# Plain functions, compiled by ``triton.jit`` on first use (see ``_kernels``): the
# module imports without triton, and TRITON_INTERPRET is read when they are compiled.


def _sgd_reduce(
    tab_ptr,
    blk_ptr,
    tf_ptr,
    part_ptr,
    scale_ptr,
    wd: tl.float64,
    DT: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    MASKED: tl.constexpr,
    ALIGNED: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    HAS_WD: tl.constexpr,
):
    pid = tl.program_id(0)
    t = tl.load(blk_ptr + 3 * pid).to(tl.int64)
    start = tl.load(blk_ptr + 3 * pid + 1).to(tl.int64) * CHUNK
    row = tl.load(blk_ptr + 3 * pid + 2).to(tl.int64)
    meta = tab_ptr + 6 * t
    x_ptr = tl.load(meta).to(tl.pointer_type(DT))
    g_ptr = tl.load(meta + 1).to(tl.pointer_type(DT))
    d_ptr = tl.load(meta + 2).to(tl.pointer_type(DT))
    if ALIGNED:
        x_ptr = tl.multiple_of(x_ptr, 16)
        g_ptr = tl.multiple_of(g_ptr, 16)
        d_ptr = tl.multiple_of(d_ptr, 16)
    n = tl.load(meta + 3)
    fresh = tl.load(tf_ptr + tl.load(meta + 5)) != 0
    wd = tl.full((), wd, tl.float64).to(ACC)
    if HAS_SCALE:
        scale = tl.load(scale_ptr).to(ACC)
    # tl.reduce with tl.sum's combine function rather than tl.sum (or tl.zeros), which are
    # jit functions of triton.language: the interpreter runs those only if TRITON_INTERPRET
    # was set before triton was imported, and these kernels must run in it either way
    vv = tl.full([BLOCK], 0.0, ACC)
    gg = tl.full([BLOCK], 0.0, ACC)
    dd = tl.full([BLOCK], 0.0, ACC)
    for off in range(0, CHUNK, BLOCK):
        idx = start + off + tl.arange(0, BLOCK)
        if MASKED:
            m = idx < n
            z = 0.0
        else:
            m = None
            z = None
        g = tl.load(g_ptr + idx, mask=m, other=z).to(ACC)
        if HAS_SCALE:
            g = g / scale
        if MAXIMIZE:
            g = -g
        if HAS_WD:
            g = g + wd * tl.load(x_ptr + idx, mask=m, other=z).to(ACC)
        d = tl.where(fresh, g, tl.load(d_ptr + idx, mask=m, other=z).to(ACC))
        v = d - g
        vv += v * v
        gg += g * g
        dd += d * d
    out = part_ptr + 3 * row
    tl.store(out, tl.reduce(vv, 0, tl.standard._sum_combine))
    tl.store(out + 1, tl.reduce(gg, 0, tl.standard._sum_combine))
    tl.store(out + 2, tl.reduce(dd, 0, tl.standard._sum_combine))


def _sgd_apply(
    tab_ptr,
    blk_ptr,
    tf_ptr,
    coef_ptr,
    scale_ptr,
    inf_ptr,
    lr: tl.float64,
    wd: tl.float64,
    DT: tl.constexpr,
    CT: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    MASKED: tl.constexpr,
    ALIGNED: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_INF: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    HAS_WD: tl.constexpr,
):
    pid = tl.program_id(0)
    t = tl.load(blk_ptr + 3 * pid).to(tl.int64)
    start = tl.load(blk_ptr + 3 * pid + 1).to(tl.int64) * CHUNK
    meta = tab_ptr + 6 * t
    x_ptr = tl.load(meta).to(tl.pointer_type(DT))
    g_ptr = tl.load(meta + 1).to(tl.pointer_type(DT))
    d_ptr = tl.load(meta + 2).to(tl.pointer_type(DT))
    if ALIGNED:
        x_ptr = tl.multiple_of(x_ptr, 16)
        g_ptr = tl.multiple_of(g_ptr, 16)
        d_ptr = tl.multiple_of(d_ptr, 16)
    n = tl.load(meta + 3)
    gamma = tl.load(coef_ptr + tl.load(meta + 4)).to(CT)
    fresh = tl.load(tf_ptr + tl.load(meta + 5)) != 0
    lr = tl.full((), lr, tl.float64).to(CT)
    wd = tl.full((), wd, tl.float64).to(CT)
    if HAS_SCALE:
        scale = tl.load(scale_ptr).to(CT)
    if HAS_INF:
        ok = tl.broadcast_to(tl.load(inf_ptr), [BLOCK]) == 0
    for off in range(0, CHUNK, BLOCK):
        idx = start + off + tl.arange(0, BLOCK)
        if MASKED:
            m = idx < n
            z = 0.0
            if HAS_INF:
                sm = m & ok
            else:
                sm = m
        else:
            m = None
            z = None
            if HAS_INF:
                sm = ok
            else:
                sm = None
        g = tl.load(g_ptr + idx, mask=m, other=z).to(CT)
        x = tl.load(x_ptr + idx, mask=m, other=z).to(CT)
        if HAS_SCALE:
            g = g / scale
        if MAXIMIZE:
            g = -g
        if HAS_WD:
            g = g + wd * x
        d = tl.where(fresh, g, tl.load(d_ptr + idx, mask=m, other=z).to(CT))
        d = g + gamma * (d - g)  # exact when d = g
        x = x - lr * d
        tl.store(d_ptr + idx, d.to(DT), mask=sm)
        tl.store(x_ptr + idx, x.to(DT), mask=sm)


def _adam_reduce(
    tab_ptr,
    blk_ptr,
    tf_ptr,
    c_ptr,
    part_ptr,
    scale_ptr,
    beta2: tl.float64,
    omb2: tl.float64,
    eps: tl.float64,
    lam: tl.float64,
    l2: tl.float64,
    a0: tl.float64,
    a1: tl.float64,
    a2: tl.float64,
    a3: tl.float64,
    a4: tl.float64,
    DT: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    MASKED: tl.constexpr,
    ALIGNED: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    L2: tl.constexpr,
    HAS_WD: tl.constexpr,
    HAS_GD: tl.constexpr,
):
    pid = tl.program_id(0)
    t = tl.load(blk_ptr + 3 * pid).to(tl.int64)
    start = tl.load(blk_ptr + 3 * pid + 1).to(tl.int64) * CHUNK
    row = tl.load(blk_ptr + 3 * pid + 2).to(tl.int64)
    meta = tab_ptr + 7 * t
    x_ptr = tl.load(meta).to(tl.pointer_type(DT))
    g_ptr = tl.load(meta + 1).to(tl.pointer_type(DT))
    d_ptr = tl.load(meta + 2).to(tl.pointer_type(DT))
    v_ptr = tl.load(meta + 3).to(tl.pointer_type(DT))
    if ALIGNED:
        x_ptr = tl.multiple_of(x_ptr, 16)
        g_ptr = tl.multiple_of(g_ptr, 16)
        d_ptr = tl.multiple_of(d_ptr, 16)
        v_ptr = tl.multiple_of(v_ptr, 16)
    n = tl.load(meta + 4)
    c = tl.load(c_ptr + tl.load(meta + 5)).to(ACC)
    bias2 = tl.load(tf_ptr + tl.load(meta + 6)).to(ACC)
    beta2 = tl.full((), beta2, tl.float64).to(ACC)
    omb2 = tl.full((), omb2, tl.float64).to(ACC)
    eps = tl.full((), eps, tl.float64).to(ACC)
    lam = tl.full((), lam, tl.float64).to(ACC)
    l2 = tl.full((), l2, tl.float64).to(ACC)
    a0 = tl.full((), a0, tl.float64).to(ACC)
    a1 = tl.full((), a1, tl.float64).to(ACC)
    a2 = tl.full((), a2, tl.float64).to(ACC)
    a3 = tl.full((), a3, tl.float64).to(ACC)
    a4 = tl.full((), a4, tl.float64).to(ACC)
    if HAS_SCALE:
        scale = tl.load(scale_ptr).to(ACC)
    num = tl.full([BLOCK], 0.0, ACC)
    den = tl.full([BLOCK], 0.0, ACC)
    ref = tl.full([BLOCK], 0.0, ACC)
    for off in range(0, CHUNK, BLOCK):
        idx = start + off + tl.arange(0, BLOCK)
        if MASKED:
            m = idx < n
            z = 0.0
        else:
            m = None
            z = None
        g = tl.load(g_ptr + idx, mask=m, other=z).to(ACC)
        if HAS_SCALE:
            g = g / scale
        if MAXIMIZE:
            g = -g
        if L2 or HAS_WD:
            x = tl.load(x_ptr + idx, mask=m, other=z).to(ACC)
        if L2:
            g = g + l2 * x
        d = tl.load(d_ptr + idx, mask=m, other=z).to(ACC)
        v = tl.load(v_ptr + idx, mask=m, other=z).to(ACC)
        v = v * beta2 + omb2 * g * g
        if ACC == tl.float64:
            p = c * (tl.sqrt(v / bias2) + eps)
        else:
            p = c * (tl.sqrt_rn(v / bias2) + eps)
        u = 1.0 / (1.0 + lam * p)
        w = u / p
        dg = d - g
        # weighted squares as (w a) a: about |a| in size where a * a leaves float's range
        gp = g / p
        terms = a0 * (gp * g) + a1 * ((u * dg) * dg)
        if HAS_WD:
            terms += a2 * (gp * d) + a3 * (g * x) + a4 * (d * x)
        elif HAS_GD:  # no decay, a learning-rate ratio r != 1: a2 = r - 1
            terms += a2 * (gp * d)
        wvv = (w * dg) * dg
        wref = (w * d) * d + (w * g) * g
        if MASKED:  # p may be 0 on the padding (eps = 0): keep its 0/0 out of the sums
            terms = tl.where(m, terms, 0.0)
            wvv = tl.where(m, wvv, 0.0)
            wref = tl.where(m, wref, 0.0)
        num += terms
        den += wvv
        ref += wref
    out = part_ptr + 3 * row
    tl.store(out, tl.reduce(num, 0, tl.standard._sum_combine))
    tl.store(out + 1, tl.reduce(den, 0, tl.standard._sum_combine))
    tl.store(out + 2, tl.reduce(ref, 0, tl.standard._sum_combine))


def _adam_apply(
    tab_ptr,
    blk_ptr,
    tf_ptr,
    c_ptr,
    beta_ptr,
    scale_ptr,
    inf_ptr,
    beta2: tl.float64,
    omb2: tl.float64,
    eps: tl.float64,
    lam: tl.float64,
    l2: tl.float64,
    lr: tl.float64,
    decay: tl.float64,
    DT: tl.constexpr,
    CT: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    MASKED: tl.constexpr,
    ALIGNED: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_INF: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    L2: tl.constexpr,
    DECAY: tl.constexpr,
):
    # DECAY: 0 none, 1 decoupled x <- decay * x - lr d/p, 2 proximal x <- (x - lr d/p) / decay
    pid = tl.program_id(0)
    t = tl.load(blk_ptr + 3 * pid).to(tl.int64)
    start = tl.load(blk_ptr + 3 * pid + 1).to(tl.int64) * CHUNK
    meta = tab_ptr + 7 * t
    x_ptr = tl.load(meta).to(tl.pointer_type(DT))
    g_ptr = tl.load(meta + 1).to(tl.pointer_type(DT))
    d_ptr = tl.load(meta + 2).to(tl.pointer_type(DT))
    v_ptr = tl.load(meta + 3).to(tl.pointer_type(DT))
    if ALIGNED:
        x_ptr = tl.multiple_of(x_ptr, 16)
        g_ptr = tl.multiple_of(g_ptr, 16)
        d_ptr = tl.multiple_of(d_ptr, 16)
        v_ptr = tl.multiple_of(v_ptr, 16)
    n = tl.load(meta + 4)
    scope = tl.load(meta + 5)
    c = tl.load(c_ptr + scope).to(CT)
    beta = tl.load(beta_ptr + scope).to(CT)
    bias2 = tl.load(tf_ptr + tl.load(meta + 6)).to(CT)
    beta2 = tl.full((), beta2, tl.float64).to(CT)
    omb2 = tl.full((), omb2, tl.float64).to(CT)
    eps = tl.full((), eps, tl.float64).to(CT)
    lam = tl.full((), lam, tl.float64).to(CT)
    l2 = tl.full((), l2, tl.float64).to(CT)
    lr = tl.full((), lr, tl.float64).to(CT)
    decay = tl.full((), decay, tl.float64).to(CT)
    if HAS_SCALE:
        scale = tl.load(scale_ptr).to(CT)
    if HAS_INF:
        ok = tl.broadcast_to(tl.load(inf_ptr), [BLOCK]) == 0
    for off in range(0, CHUNK, BLOCK):
        idx = start + off + tl.arange(0, BLOCK)
        if MASKED:
            m = idx < n
            z = 0.0
            if HAS_INF:
                sm = m & ok
            else:
                sm = m
        else:
            m = None
            z = None
            if HAS_INF:
                sm = ok
            else:
                sm = None
        g = tl.load(g_ptr + idx, mask=m, other=z).to(CT)
        x = tl.load(x_ptr + idx, mask=m, other=z).to(CT)
        if HAS_SCALE:
            g = g / scale
        if MAXIMIZE:
            g = -g
        if L2:
            g = g + l2 * x
        d = tl.load(d_ptr + idx, mask=m, other=z).to(CT)
        v = tl.load(v_ptr + idx, mask=m, other=z).to(CT)
        v = v * beta2 + omb2 * g * g
        if CT == tl.float64:
            p = c * (tl.sqrt(v / bias2) + eps)
        else:
            p = c * (tl.sqrt_rn(v / bias2) + eps)
        lam_p = lam * p
        d = g + (beta + lam_p) / (1.0 + lam_p) * (d - g)
        if DECAY == 1:
            x = x * decay
        x = x - lr * d / p
        if DECAY == 2:
            x = x / decay
        tl.store(v_ptr + idx, v.to(DT), mask=sm)
        tl.store(d_ptr + idx, d.to(DT), mask=sm)
        tl.store(x_ptr + idx, x.to(DT), mask=sm)


def _segment_sum(
    part_ptr,
    seg_ptr,
    out_ptr,
    ACC: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,
    ROWS: tl.constexpr,
):
    # rows [seg[s], seg[s+1]) of the partial sums, added in a fixed order; a while loop, as
    # a loop bound held in a tensor is not one to every interpreter (Triton 3.6's keeps
    # scalars as one-element arrays, which recent NumPy will not turn into an index)
    s = tl.program_id(0)
    lo = tl.load(seg_ptr + s)
    hi = tl.load(seg_ptr + s + 1)
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, KP)
    acc = tl.full([ROWS, KP], 0.0, ACC)
    r = lo
    while r < hi:
        rr = r + rows
        m = (rr < hi)[:, None] & (cols < K)[None, :]
        acc += tl.load(part_ptr + rr[:, None] * K + cols[None, :], mask=m, other=0.0)
        r += ROWS
    tl.store(out_ptr + s * K + cols, tl.reduce(acc, 0, tl.standard._sum_combine), mask=cols < K)


#: Jitted rule kernels by (rule, config, dtype, interpreted).
_RULE_BY_KEY: dict[tuple, Any] = {}
_RULE_DTYPES = {torch.float64: np.float64, torch.float32: np.float32}


def _rule_kernel(
    rule: Any,
    config: AMConfig,
    dtype: torch.dtype,
    interpret: bool = False,
    extra: str | None = None,
) -> Any:
    """``rule(xp, sums, config)`` of every scope in one Triton kernel, or None.

    With ``extra``, the rule's keyword argument of that name is a fourth input of each
    scope (:func:`amopt.core.tape.input_rule`: the learning-rate ratio, the first-step flag).

    The rule (:mod:`amopt.core.rule`, as it is when the step runs) is recorded as a tape
    of its operations on sums of ``dtype`` (:func:`amopt.core.tape.trace`) and written out
    as a kernel (:func:`amopt.core.tape.triton_source`) that evaluates it per scope, each
    operation rounding once in ``dtype`` as the rule's array operations do: one launch
    in place of the rule's fifteen or so small ones. The kernel is compiled once per
    tape (an interpreted one with ``interpret``). None where the rule cannot be
    recorded (the caller runs it on arrays).
    """
    key = (rule, config, dtype, interpret, extra)
    if key in _RULE_BY_KEY:
        return _RULE_BY_KEY[key]
    kernel = _RULE_BY_KEY[key] = _make_rule_kernel(rule, config, dtype, interpret, extra)
    return kernel


def _make_rule_kernel(
    rule: Any, config: AMConfig, dtype: torch.dtype, interpret: bool, extra: str | None
) -> Any:
    np_dtype = _RULE_DTYPES.get(dtype)
    if np_dtype is None:
        return None
    if extra is None:
        tape = _tape.traced(rule, _K, cfg=config, dtype=np_dtype)
    else:
        tape = _tape.traced(
            _tape.input_rule, _K + 1, base=rule, name=extra, cfg=config, dtype=np_dtype
        )
    return None if tape is None else _emit.triton_kernel(*tape, np_dtype, interpret)


def _fused_rule(
    make: Any,
    rule: Any,
    config: AMConfig,
    sums: Tensor,
    n_out: int,
    out: torch.dtype,
    interpret: bool,
    extra: str | None = None,
) -> Tensor | None:
    """The outputs of ``rule``'s kernel (:func:`_rule_kernel`, made by ``make``) on
    ``sums``, or None: no kernel (the caller runs the rule's array operations), or one
    that Triton could not compile here (then never again for that rule, with a warning).
    ``extra``: the name of the rule's keyword argument held in the fourth column."""
    if make is None:
        return None
    try:
        kernel = make(rule, config, sums.dtype, extra=extra)
        if kernel is None:
            return None
        return _torch_rule.run_rule(kernel, sums, n_out, out, interpret)
    except Exception as exc:  # noqa: BLE001 - a compiler that rejects the generated kernel
        _RULE_BY_KEY[(rule, config, sums.dtype, interpret, extra)] = None
        warnings.warn(
            f"the AM rule's Triton kernel failed ({type(exc).__name__}: {exc}); the rule "
            "runs as tensor operations",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


@functools.cache
def _kernels(interpret: bool) -> dict[str, Any]:
    """The kernels compiled by ``triton.jit`` (interpreted ones under ``TRITON_INTERPRET``)."""
    global tl
    import triton
    import triton.language

    tl = triton.language
    fns = (_sgd_reduce, _sgd_apply, _adam_reduce, _adam_apply, _segment_sum)
    kernels: dict[str, Any] = {fn.__name__.lstrip("_"): triton.jit(fn) for fn in fns}
    kernels["rule"] = functools.partial(_rule_kernel, interpret=interpret)
    kernels["dtypes"] = {
        torch.float16: tl.float16,
        torch.bfloat16: tl.bfloat16,
        torch.float32: tl.float32,
        torch.float64: tl.float64,
    }
    return kernels


# --------------------------------------------------------------------------- plan


@functools.cache
def _tl_dtypes() -> dict[torch.dtype, Any]:
    """torch dtype -> ``triton.language`` dtype (kept apart from ``_kernels``, which tests
    and benchmarks replace with stand-in launchables)."""
    import triton.language

    t = triton.language
    return {
        torch.float16: t.float16,
        torch.bfloat16: t.bfloat16,
        torch.float32: t.float32,
        torch.float64: t.float64,
    }


@dataclasses.dataclass
class _Launch:
    """The tensors of one dtype: their address table and block maps."""

    dtype: torch.dtype
    acc: torch.dtype  # the compute dtype of the sums this launch writes
    array: int  # index of that sums array
    members: list[int]  # the tensors (indices into the step's lists), in table order
    full: Tensor  # int32 (n_full, 3): table row, chunk, partial-sums row
    tail: Tensor  # int32 (n_tail, 3), the last, partial chunk of each tensor
    n_full: int
    n_tail: int
    table: Tensor | None = None  # int64 (n, columns): addresses, numel, scope, tensor index
    aligned: bool = True
    host: Tensor | None = None  # the table on the host, from which it is (re)written
    index: Tensor | None = None  # int64: ``members`` as a tensor


@dataclasses.dataclass
class _Layout:
    launches: list[_Launch]
    arrays: list[tuple[torch.dtype, int, Tensor, int]]  # (acc, partial rows, segments, scopes)
    scope_of: list[tuple[int, int]]  # per tensor: (sums array, scope)


@dataclasses.dataclass(eq=False)
class Plan:
    """Everything a step over one fixed set of tensors launches with, built once.

    The address tables and block maps (device tensors), the scopes, the buffers of
    partial and per-scope sums, and per launch the pair (block map, count) of its
    whole and its partial chunks. A plan is valid as long as the tensors it was
    built from keep their storage, shape and dtype; the drivers check that when
    they look a plan up, and the optimizers when their group's tensors change
    (:class:`GroupPlan`), not at every step.
    """

    device: torch.device
    per_layer: bool
    wide: bool
    launches: list[_Launch]
    arrays: list[tuple[torch.dtype, int, Tensor, int]]
    scope_of: list[tuple[int, int]]
    partials: list[Tensor]
    sums: list[Tensor]
    rows: list[list[int]]  # per sums array, the tensor of each scope (its first member)
    out_dtypes: list[torch.dtype]  # per sums array, the dtype of the betas handed out
    grids: list[tuple[_Launch, tuple[tuple[Tensor, int, bool], ...]]]


#: Layouts (block maps, scopes) by sizes and dtypes; plans by the tensors' addresses.
#: Least recently used first: a compiled step, or a functional call, finds its plan
#: here at every step, one per param group (a model with a group per layer has dozens).
_LAYOUTS: dict[tuple, _Layout] = {}
_PLANS: dict[tuple, Plan] = {}
_CACHE_SIZE = 256


def _remember(cache: dict, key: tuple, value: Any) -> Any:
    if len(cache) >= _CACHE_SIZE:
        cache.pop(next(iter(cache)))
    cache[key] = value
    return value


def _recall(cache: dict, key: tuple) -> Any:
    """``cache[key]`` (``None`` if absent), now the most recently used entry."""
    value = cache.pop(key, None)
    if value is not None:
        cache[key] = value
    return value


#: Plans a CUDA graph was captured with, kept for as long as the process: the graph
#: replays the plan's launches with the addresses of its tables and sums, which must
#: not be freed and reused however the caches above change.
_CAPTURED: dict[int, Plan] = {}


def _in_use(plan: Plan) -> Plan:
    """``plan``, kept alive (:data:`_CAPTURED`) when the current stream is capturing."""
    if plan.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        _CAPTURED[id(plan)] = plan
    return plan


def _acc_dtype(dtypes: Iterable[torch.dtype]) -> torch.dtype:
    return torch.float64 if torch.float64 in set(dtypes) else torch.float32


def _to(t: Tensor, device: torch.device) -> Tensor:
    """A host-built table on ``device`` (when a plan is built, never per step), copied
    asynchronously from page-locked memory into memory outside any CUDA graph's pool
    (:func:`~amopt.torch._records.kept_copy`)."""
    if device.type == "cpu":
        return t
    return kept_copy(t, device)


def _layout(
    device: torch.device,
    per_layer: bool,
    sizes: tuple[tuple[torch.dtype, int], ...],
    wide: bool = False,
) -> _Layout:
    """Launches (one per dtype), block maps and the scopes' rows of partial sums.

    ``wide``: the sums are formed and accumulated in float64 whatever the dtype.
    """
    acc_dtype = (lambda _: torch.float64) if wide else _acc_dtype
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, (dtype, _) in enumerate(sizes):
        by_dtype.setdefault(dtype, []).append(i)
    scope_of: list[tuple[int, int]] = [(0, 0)] * len(sizes)
    arrays: list[tuple[torch.dtype, int, Tensor, int]] = []
    launches: list[_Launch] = []
    global_acc = acc_dtype(by_dtype)
    global_rows = 0
    for dtype, members in by_dtype.items():
        if per_layer:
            array, acc, row0 = len(arrays), acc_dtype([dtype]), 0
        else:
            array, acc, row0 = 0, global_acc, global_rows
        numels = torch.tensor([sizes[i][1] for i in members], dtype=torch.int64)
        whole = numels // CHUNK
        has_tail = numels % CHUNK != 0
        rows = torch.cat([torch.zeros(1, dtype=torch.int64), whole + has_tail]).cumsum(0) + row0
        tensor = torch.repeat_interleave(torch.arange(len(members)), whole)
        first = torch.repeat_interleave(whole.cumsum(0) - whole, whole)
        chunk = torch.arange(int(whole.sum())) - first  # chunk index within its tensor
        full = torch.stack([tensor, chunk, rows[tensor] + chunk], 1).to(torch.int32)
        tails = torch.nonzero(has_tail).flatten()
        tail = torch.stack([tails, whole[tails], rows[tails] + whole[tails]], 1).to(torch.int32)
        for k, i in enumerate(members):
            scope_of[i] = (array, k if per_layer else 0)
        launches.append(
            _Launch(
                dtype=dtype,
                acc=acc,
                array=array,
                members=members,
                full=_to(full.contiguous(), device),
                tail=_to(tail.contiguous(), device),
                n_full=full.shape[0],
                n_tail=tail.shape[0],
            )
        )
        if per_layer:
            segments = _to(rows.to(torch.int32), device)
            arrays.append((acc, int(rows[-1]), segments, len(members)))
        else:
            global_rows = int(rows[-1])
    if not per_layer:
        segments = _to(torch.tensor([0, global_rows], dtype=torch.int32), device)
        arrays.append((global_acc, global_rows, segments, 1))
    return _Layout(launches=launches, arrays=arrays, scope_of=scope_of)


def build_plan(columns: Sequence[Sequence[Tensor]], per_layer: bool, wide: bool = False) -> Plan:
    """The plan of a step over tensors ``i`` described by ``columns[k][i]`` for every ``k``.

    ``columns[0]`` are the parameters; every column's tensors are contiguous, of their
    parameter's shape and dtype, on one device (checked by the callers). The layout
    is cached by dtypes and sizes (shared by plans of the same shapes), the address
    tables are the plan's own. ``wide``: sums in float64 (:func:`_layout`).
    """
    params = columns[0]
    device = params[0].device
    sizes = tuple((p.dtype, p.numel()) for p in params)
    key = (device, per_layer, CHUNK, sizes, wide)
    layout = _recall(_LAYOUTS, key) or _remember(
        _LAYOUTS, key, _layout(device, per_layer, sizes, wide)
    )
    launches = []
    for launch in layout.launches:
        ptrs = [[col[i].data_ptr() for col in columns] for i in launch.members]
        table = [
            [*row, sizes[i][1], layout.scope_of[i][1], i]
            for row, i in zip(ptrs, launch.members, strict=True)
        ]
        aligned = all(ptr % 16 == 0 for row in ptrs for ptr in row)
        host = torch.tensor(table, dtype=torch.int64)
        launches.append(
            dataclasses.replace(
                launch,
                table=_to(host, device) if device.type != "cpu" else host.clone(),
                aligned=aligned,
                host=host,
                index=torch.tensor(launch.members, dtype=torch.int64),
            )
        )
    rows: list[list[int]] = [[] for _ in layout.arrays]
    for i, (a, s) in enumerate(layout.scope_of):
        if len(rows[a]) <= s:
            rows[a].append(i)
    if per_layer:
        out_dtypes = [_acc_dtype([params[r[0]].dtype]) for r in rows]
    else:
        out_dtypes = [_acc_dtype(p.dtype for p in params)]
    partials = [
        kept_empty((max(n_rows, 1), _K), acc, device) for acc, n_rows, _, _ in layout.arrays
    ]
    sums = [kept_empty((n_scopes, _K), acc, device) for acc, _, _, n_scopes in layout.arrays]
    grids = [
        (
            launch,
            tuple(
                (blocks, count, masked)
                for blocks, count, masked in (
                    (launch.full, launch.n_full, False),
                    (launch.tail, launch.n_tail, True),
                )
                if count
            ),
        )
        for launch in launches
    ]
    return Plan(
        device=device,
        per_layer=per_layer,
        wide=wide,
        launches=launches,
        arrays=layout.arrays,
        scope_of=layout.scope_of,
        partials=partials,
        sums=sums,
        rows=rows,
        out_dtypes=out_dtypes,
        grids=grids,
    )


def rebind(plan: Plan, column: int, ptrs: Sequence[int]) -> bool:
    """Point column ``column`` of the plan's address tables at ``ptrs`` (per tensor), in place.

    For tensors of the same shapes and dtypes at new addresses (gradients that autograd
    allocated anew, as after ``zero_grad()``): one host tensor of the addresses, one
    gather and one copy per launch (per dtype) into the host table, and one
    asynchronous copy of it to the device from page-locked memory, behind the kernels
    of the previous step on the stream; no synchronisation, no per-tensor work but
    reading the addresses. The page-locked buffer comes from torch's caching host
    allocator, which does not hand it out again before the copy from it has run.
    Returns ``False`` (nothing changed) where an address is not 16-byte aligned in a
    plan built for aligned tensors: the plan must then be built again.
    """
    found = np.fromiter(ptrs, dtype=np.int64, count=len(ptrs))
    if (found & 15).any() and any(launch.aligned for launch in plan.launches):
        return False
    addresses = torch.from_numpy(found)
    for launch in plan.launches:
        host, table = launch.host, launch.table
        if host is None or table is None or launch.index is None:
            return False
        host[:, column] = addresses.index_select(0, launch.index)
        if plan.device.type == "cpu":
            table.copy_(host)
            continue
        table.copy_(staged(host), non_blocking=True)
    return True


_DTYPE = operator.attrgetter("dtype")
#: where a key of :func:`_plan_keys` holds the parameters' dtypes
_KEY_DTYPES = 4

#: Plans by everything but the gradients' addresses: (key in ``_PLANS``, plan).
_BY_STATE: dict[tuple, tuple[tuple, Plan]] = {}


def _plan_keys(
    columns: Sequence[Sequence[Tensor]], per_layer: bool, wide: bool
) -> tuple[tuple, tuple, list[tuple[int, ...]]]:
    """The key of a plan in ``_PLANS``, the key without the gradients' addresses (in
    ``_BY_STATE``), and the addresses of each column."""
    params = columns[0]
    shape = (
        params[0].device,
        per_layer,
        wide,
        CHUNK,
        tuple(map(_DTYPE, params)),
        tuple(map(Tensor.numel, params)),
    )
    ptrs = [tuple(map(Tensor.data_ptr, col)) for col in columns]
    key = (*shape, *ptrs)
    return key, (*shape, ptrs[0], *ptrs[2:]), ptrs


def _plan(columns: Sequence[Sequence[Tensor]], per_layer: bool, wide: bool = False) -> Plan:
    """:func:`build_plan`, cached by the tensors' addresses, sizes and dtypes.

    A step whose gradients (``columns[1]``) are new tensors at new addresses, the other
    tensors where they were (``zero_grad()``, or sharded gradients reduced anew at every
    step), takes the plan of the previous step with its gradient addresses rewritten
    (:func:`rebind`) rather than a new one.
    """
    key, rest, ptrs = _plan_keys(columns, per_layer, wide)
    plan = _recall(_PLANS, key)
    if plan is not None:
        _recall(_BY_STATE, rest)
        return _in_use(plan)
    known = _BY_STATE.get(rest)
    if known is not None and len(columns) > 1:
        old_key, plan = known
        if _PLANS.get(old_key) is plan and rebind(plan, 1, ptrs[1]):
            del _PLANS[old_key]
            _PLANS[key] = plan
            _BY_STATE.pop(rest)
            _BY_STATE[rest] = (key, plan)
            return _in_use(plan)
    plan = _remember(_PLANS, key, build_plan(columns, per_layer, wide))
    _remember(_BY_STATE, rest, (key, plan))
    return _in_use(plan)


def _checked_plan(
    columns: Sequence[Sequence[Tensor]], per_layer: bool, wide: bool = False
) -> Plan | None:
    """The cached plan of exactly these tensors, or ``None``: the step's fast check.

    A plan is cached only after its tensors passed the driver's checks; the same
    addresses with the same sizes and dtypes of the parameters, every column in the
    parameters' dtypes and contiguous, are those tensors again (a tensor of another
    shape at the same address and size is a view of the same memory, which the kernels
    read flat). What this does per tensor runs in C (addresses, contiguity) but for
    reading the dtypes; the full checks (:func:`available`) run where this misses.
    """
    try:  # data_ptr raises for tensors without storage (sparse): the full checks say why
        key, _, _ = _plan_keys(columns, per_layer, wide)
    except (AttributeError, RuntimeError, TypeError):
        return None
    plan = _recall(_PLANS, key)
    if plan is None:
        return None
    dtypes = key[_KEY_DTYPES]
    for col in columns:
        if not all(map(Tensor.is_contiguous, col)):
            return None
        if col is not columns[0] and tuple(map(_DTYPE, col)) != dtypes:
            return None
    return _in_use(plan)


# --------------------------------------------------------------------------- group state


@dataclasses.dataclass(eq=False)
class GroupState:
    """The 0-d state of a param group's step as group-level device tensors.

    ``steps``: the step counter of every tensor, shape ``(n,)``; per sums array of
    the plan, ``prods`` (AM-Adam(W)'s running products :math:`\\pi`, one per scope,
    in the compute dtype; ``None`` for AMSGD) and ``betas`` (the beta last
    applied per scope). The optimizers keep their per-parameter state entries as
    views of these tensors, so that a step updates them all with a few operations.
    """

    steps: Tensor
    prods: list[Tensor] | None
    betas: list[Tensor]


def _written(params: Sequence[Tensor]) -> None:
    """Increment the autograd version counters of the parameters the kernels wrote (in
    one call), as torch's in-place operators do: autograd then refuses a backward pass
    through parameter values that a step has overwritten since a forward pass saved
    them. The optimizer's own buffers, which no forward pass reads, are not bumped (at
    1480 tensors that would triple this call's host time)."""
    torch.autograd.graph.increment_version(params)


def _advance(steps: Tensor, found_inf: Tensor | None) -> None:
    """``steps += 1`` on the device, or no change where ``found_inf`` is nonzero."""
    if found_inf is None:
        steps.add_(1)
    else:
        steps.add_((found_inf == 0).to(steps.dtype))


def _keep_where_skipped(old: Tensor, new: Tensor, found_inf: Tensor | None) -> Tensor:
    return new if found_inf is None else torch.where(found_inf != 0, old, new)


# --------------------------------------------------------------------------- driver


def _check_lists(name: str, params: Sequence[Tensor], **lists: Sequence[Any]) -> None:
    for key, values in lists.items():
        if len(values) != len(params):
            raise ValueError(
                f"{name}: {key} has {len(values)} entries for {len(params)} parameters"
            )


def _check_like(name: str, params: Sequence[Tensor], **lists: Sequence[Tensor | None]) -> None:
    for key, values in lists.items():
        for i, (p, t) in enumerate(zip(params, values, strict=True)):
            if t is None:
                continue
            if t.shape != p.shape or t.dtype != p.dtype:
                raise ValueError(
                    f"{name}: {key}[{i}] has shape {tuple(t.shape)} and dtype {t.dtype}; "
                    f"its parameter has shape {tuple(p.shape)} and dtype {p.dtype}"
                )


def _require(name: str, tensors: Iterable[Tensor]) -> None:
    reason = available(tensors)
    if reason is not None:
        raise ValueError(f"{name} cannot run on these tensors: {reason}")


def _scaler_tensor(name: str, value: Tensor | None, device: torch.device) -> Tensor | None:
    if value is None:
        return None
    if not isinstance(value, Tensor) or value.numel() != 1:
        raise TypeError(f"{name} must be None or a one-element tensor; got {value!r}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device}; the parameters are on {device}")
    return value.reshape(())


def _upload(t: Tensor, device: torch.device) -> Tensor:
    """A small host tensor made at a step, on ``device`` without a synchronisation.

    A copy from pageable memory makes the host wait for the stream; this one is staged
    in page-locked memory (:func:`~amopt.torch._records.staged`) and copied
    asynchronously.
    """
    if device.type != "cuda":
        return t.to(device)
    return staged(t).to(device, non_blocking=True)


def _stacked(values: Sequence[Tensor], device: torch.device, dtype: torch.dtype) -> Tensor:
    """One-element tensors (0-d as the optimizers keep them) as one ``(n,)`` tensor of
    ``dtype`` on ``device``.

    Values on the host (step counters without ``capturable``) are stacked there and
    uploaded in one asynchronous copy (:func:`_upload`), not one blocking copy each;
    0-d values on one device take one ``stack``, with no operation per value.
    """
    try:
        stacked = torch.stack(values)  # 0-d values: (n,)
    except RuntimeError:  # shapes differ (a (1,) value among 0-d ones)
        stacked = None
    if stacked is None or stacked.dim() != 1:
        flat = [v.detach().reshape(()) for v in values]
        devices = {v.device for v in flat}
        if len(devices) > 1:
            return torch.stack([v.to(device) for v in flat]).to(dtype)
        stacked = torch.stack(flat)
    if stacked.device == device:
        return stacked.to(dtype)
    return _upload(stacked.to(dtype), device)


def _stacked_steps(state_steps: Sequence[Tensor], device: torch.device) -> Tensor:
    """The step counters (before this step) as one float64 tensor on ``device``."""
    return _stacked(state_steps, device, torch.float64)


def _count_step(state_steps: Sequence[Tensor], found_inf: Tensor | None) -> None:
    """``step += 1``, or, on a skipped step (``found_inf`` nonzero), no change."""
    steps = list(state_steps)
    if steps[0].is_cpu:  # a wrapped 1: the scalar overload loops 4x slower over CPU counters
        torch._foreach_add_(steps, torch.tensor(1.0), alpha=1.0)
    else:
        torch._foreach_add_(steps, 1.0)
    if found_inf is None:
        return
    same = [s for s in state_steps if s.device == found_inf.device]
    other = [s for s in state_steps if s.device != found_inf.device]
    if same:
        torch._foreach_sub_(same, [found_inf] * len(same))
    if other:
        # host counters with a device found_inf: the only value read on the host
        value = found_inf.to(other[0].device)
        torch._foreach_sub_(other, [value] * len(other))


def _launch_options(interpret: bool) -> dict[str, Any]:
    return {} if interpret else {"num_warps": NUM_WARPS, "enable_fp_fusion": True}


def _reduce_and_sum(
    plan: Plan, launch_reduce: Any, kernels: dict[str, Any], options: dict[str, Any], sync: Any
) -> list[Tensor]:
    """Partial sums of every block, then the sums of each scope: one array per ``plan.arrays``.

    ``sync`` (``amopt.torch._distributed.ScopeSync``): the sums of scopes sharded across
    ranks are added over the ranks here, between the reduce and the rule.
    """
    for launch, grids in plan.grids:
        for blocks, count, masked in grids:
            launch_reduce(launch, blocks, count, masked, plan.partials[launch.array])
    tl_dtypes = _tl_dtypes()
    for (acc, _, segments, n_scopes), part, out in zip(
        plan.arrays, plan.partials, plan.sums, strict=True
    ):
        kernels["segment_sum"][(n_scopes,)](
            part,
            segments,
            out,
            ACC=tl_dtypes[acc],
            K=_K,
            KP=4,
            ROWS=SEGMENT_ROWS,
            **options,
        )
    if sync is None or not sync.needs_collective:
        return plan.sums
    return sync.combine(plan.sums, plan.rows if plan.per_layer else None)


def _sgd_core(
    plan: Plan, fresh: Tensor, h: SGDHyper, amp: Scaler, sync: Any
) -> list[tuple[Tensor, Tensor]]:
    """Reduce, rule and apply of an AMSGD step; ``(beta, gamma)`` per sums array."""
    lr, weight_decay, maximize, config, lr_ratio = h
    grad_scale, found_inf = amp
    interpret = _interpret()
    kernels = _kernels(interpret)
    options = _launch_options(interpret)
    tl_dtypes = _tl_dtypes()
    scale = grad_scale if grad_scale is not None else fresh
    inf = found_inf if found_inf is not None else fresh
    has_wd = weight_decay != 0
    reduce = kernels["sgd_reduce"]

    def launch_reduce(
        launch: _Launch, blocks: Tensor, count: int, masked: bool, part: Tensor
    ) -> None:
        reduce[(count,)](
            launch.table,
            blocks,
            fresh,
            part,
            scale,
            weight_decay,
            DT=tl_dtypes[launch.dtype],
            ACC=tl_dtypes[launch.acc],
            BLOCK=BLOCK,
            CHUNK=CHUNK,
            MASKED=masked,
            ALIGNED=launch.aligned,
            HAS_SCALE=grad_scale is not None,
            MAXIMIZE=maximize,
            HAS_WD=has_wd,
            **options,
        )

    sums = _reduce_and_sum(plan, launch_reduce, kernels, options, sync)
    # the squares of float32 gradients leave float32's range long before the gradients
    # do, and beta, a ratio of their sums, does not: the sums are float64, the rule runs
    # on them and its outputs are rounded to the compute dtype
    make = kernels.get("rule")
    rule = []
    # r = lr_{t-1} / lr_t: a fourth input of the rule where it is not the number 1
    scheduled = not (isinstance(lr_ratio, (int, float)) and lr_ratio == 1.0)
    for s, out in zip(sums, plan.out_dtypes, strict=True):
        if scheduled:
            ratio = torch.as_tensor(lr_ratio, dtype=s.dtype).to(s.device, non_blocking=True)
            s4 = torch.cat([s, ratio.reshape(1, 1).expand(s.shape[0], 1)], 1)
            both = _fused_rule(
                make, _rule.momentum_beta, config, s4, 2, out, interpret, "lr_ratio"
            )
        else:
            both = _fused_rule(make, _rule.momentum_beta, config, s, 2, out, interpret)
        if both is None:
            kwargs = {"lr_ratio": s4[:, 3]} if scheduled else {}
            beta_gamma = _rule.momentum_beta(torch, s, config, **kwargs)
            rule.append(tuple(r.to(out) for r in beta_gamma))
        else:  # beta and gamma in one launch
            rule.append((both[0], both[1]))
    apply = kernels["sgd_apply"]
    for launch, grids in plan.grids:
        gamma = rule[launch.array][1]
        ct = tl_dtypes[torch.float64 if launch.dtype == torch.float64 else torch.float32]
        for blocks, count, masked in grids:
            apply[(count,)](
                launch.table,
                blocks,
                fresh,
                gamma,
                scale,
                inf,
                lr,
                weight_decay,
                DT=tl_dtypes[launch.dtype],
                CT=ct,
                BLOCK=BLOCK,
                CHUNK=CHUNK,
                MASKED=masked,
                ALIGNED=launch.aligned,
                HAS_SCALE=grad_scale is not None,
                HAS_INF=found_inf is not None,
                MAXIMIZE=maximize,
                HAS_WD=has_wd,
                **options,
            )
    return rule  # type: ignore[return-value]


def _check_sgd_hyper(name: str, h: SGDHyper) -> SGDHyper:
    lr, weight_decay, maximize, config, lr_ratio = h
    if not isinstance(config, AMConfig):
        raise TypeError(f"{name}: config must be an AMConfig; got {config!r}")
    return SGDHyper(
        check_nonnegative("lr", lr),
        check_nonnegative("weight_decay", weight_decay),
        check_bool("maximize", maximize),
        config,
        check_nonnegative("lr_ratio", lr_ratio),
    )


def triton_amsgd(
    t: SGDTensors,
    h: SGDHyper,
    amp: Scaler = NO_SCALER,
    *,
    plan: Plan | None = None,
    state: GroupState | None = None,
    sync: Any = None,
) -> list[Tensor]:
    r"""AMSGD (AM-MSGD) step over one param group with the Triton kernels, in place.

    The same step as ``amsgd(..., foreach=False)`` (``docs/algorithms.md``,
    section 2, linearised numerator): :math:`g \leftarrow g + \mu x`, ``d = g`` on
    the first step, :math:`\beta, \gamma` from the sums ``<v,v>, <g,g>, <d,d>``
    (:func:`amopt.core.rule.momentum_beta`), :math:`d \leftarrow g + \gamma (d - g)`,
    :math:`x \leftarrow x - \eta d`.

    Parameters
    ----------
    t : SGDTensors
        ``params`` (updated in place) and ``grads``: contiguous, same shape and dtype,
        on one CUDA device (see :func:`available`); ``momentum_buffer_list``: the
        buffers :math:`d` in the parameter dtype, updated in place, a ``None`` entry
        replaced by a new buffer (the first step, ``d = g``; a buffer whose step counter
        is 0 is also treated as a first step); ``state_steps``: 0-d step counters (CPU
        or device), incremented in place (not on a skipped step).
    h : SGDHyper
        ``lr`` and ``weight_decay``: :math:`\eta \ge 0` and the coupled L2 decay
        :math:`\mu \ge 0`; ``maximize``: ascend instead of descend; ``config``:
        ``lam``, ``beta_max``, ``per_layer`` (one beta per tensor) and the variant (the
        numerator is always the linearised one).
    amp : Scaler, optional
        One-element tensors: the gradients are divided by ``grad_scale``
        (GradScaler's scale); a nonzero ``found_inf`` skips the step: parameters,
        buffers and step counters keep their values.
    plan, state : Plan, GroupState, optional
        Given together (by :class:`GroupPlan`): the plan built for exactly these
        tensors, every buffer present, and the group's counters and betas as device
        tensors, which the step updates in place (``state_steps`` is then not read);
        nothing is checked and nothing per tensor runs on the host.
    sync : ScopeSync, optional
        Scopes sharded across ranks (``amopt.torch._distributed``): their sums are
        added over the ranks between the reduce and the rule.

    Returns
    -------
    list of Tensor
        The 0-d beta of each parameter's scope, in the compute dtype (one
        tensor shared by every parameter when ``config.per_layer`` is False); with
        ``state``, ``state.betas`` (one tensor per sums array) instead.
    """
    name = "triton_amsgd"
    grad_scale, found_inf = amp
    if plan is not None and state is not None:
        h = _check_sgd_hyper(name, h)
        with torch.no_grad():
            fresh = (state.steps == 0).to(torch.float64)
            rule = _sgd_core(_in_use(plan), fresh, h, amp, sync)
            for old, (beta, _) in zip(state.betas, rule, strict=True):
                old.copy_(_keep_where_skipped(old, beta, found_inf))
            _advance(state.steps, found_inf)
        _written(t.params)
        return state.betas
    params, grads, momentum_buffer_list, state_steps = t
    _check_lists(
        name,
        params,
        grads=grads,
        momentum_buffer_list=momentum_buffer_list,
        state_steps=state_steps,
    )
    h = _check_sgd_hyper(name, h)
    n = len(params)
    if n == 0:
        return []
    new = [b is None for b in momentum_buffer_list]
    plan = None
    if not any(new):
        plan = _checked_plan([params, grads, momentum_buffer_list], h.config.per_layer, True)
    if plan is None:
        _check_like(name, params, grads=grads, momentum_buffer_list=momentum_buffer_list)
        _require(name, [*params, *grads, *(b for b in momentum_buffer_list if b is not None)])
    device = params[0].device
    amp = Scaler(
        _scaler_tensor("grad_scale", grad_scale, device),
        _scaler_tensor("found_inf", found_inf, device),
    )
    with torch.no_grad():
        for i in range(n):
            if new[i]:
                momentum_buffer_list[i] = torch.zeros_like(params[i])
        fresh = _stacked_steps(state_steps, device) == 0
        if any(new):
            fresh = fresh | _upload(torch.tensor(new), device)
        fresh = fresh.to(torch.float64)
        bufs: list[Tensor] = momentum_buffer_list  # type: ignore[assignment]
        if plan is None:
            plan = _plan([params, grads, bufs], h.config.per_layer, wide=True)
        rule = _sgd_core(plan, fresh, h, amp, sync)
        _written(params)
        _count_step(state_steps, amp.found_inf)
        return _per_tensor([beta for beta, _ in rule], plan, h.config.per_layer)


def _per_tensor(arrays: Sequence[Tensor], plan: Plan, per_layer: bool) -> list[Tensor]:
    """Entry ``scope`` of ``arrays[array]`` for each tensor; one shared 0-d tensor if global."""
    if not per_layer:
        shared = arrays[0][0]
        return [shared] * len(plan.scope_of)
    views = [list(a.unbind()) for a in arrays]
    return [views[a][s] for a, s in plan.scope_of]


def _adam_core(
    plan: Plan,
    steps: Tensor,
    prods: Sequence[Tensor],
    h: AdamHyper,
    amp: Scaler,
    sync: Any,
) -> tuple[list[Tensor], list[Tensor]]:
    """Reduce, rule and apply of an AM-Adam(W) step over ``plan``; ``steps``: the counters
    before the step. Returns per sums array the betas and the new products (the old ones
    where ``found_inf`` skips the step)."""
    lr, beta2, eps, weight_decay, weight_decay_mode, maximize, config, lr_ratio = h
    grad_scale, found_inf = amp
    interpret = _interpret()
    kernels = _kernels(interpret)
    options = _launch_options(interpret)
    tl_dtypes = _tl_dtypes()
    l2 = weight_decay if weight_decay_mode == "l2" else 0.0
    wd = 0.0 if weight_decay_mode == "l2" else weight_decay
    weights = _rule.adam_weights(config, lr=lr, weight_decay=wd, lr_ratio=lr_ratio)
    if wd == 0:
        decay_mode, decay = 0, 1.0
    elif weight_decay_mode == "proximal":
        decay_mode, decay = 2, 1.0 + lr * wd
    else:
        decay_mode, decay = 1, 1.0 - lr * wd
    lam = float(config.lam)
    bias2 = 1.0 - torch.pow(beta2, steps.to(torch.float64) + 1.0)
    corrections = [_rule.adam_correction(prod, config) for prod in prods]
    scale = grad_scale if grad_scale is not None else bias2
    inf = found_inf if found_inf is not None else bias2
    flags = {"HAS_SCALE": grad_scale is not None, "MAXIMIZE": maximize, "L2": l2 != 0}
    reduce = kernels["adam_reduce"]

    def launch_reduce(
        launch: _Launch, blocks: Tensor, count: int, masked: bool, part: Tensor
    ) -> None:
        reduce[(count,)](
            launch.table,
            blocks,
            bias2,
            corrections[launch.array],
            part,
            scale,
            beta2,
            1.0 - beta2,
            eps,
            lam,
            l2,
            *weights,
            DT=tl_dtypes[launch.dtype],
            ACC=tl_dtypes[launch.acc],
            BLOCK=BLOCK,
            CHUNK=CHUNK,
            MASKED=masked,
            ALIGNED=launch.aligned,
            HAS_WD=wd != 0,
            HAS_GD=weights[2] != 0,
            **flags,
            **options,
        )

    sums = _reduce_and_sum(plan, launch_reduce, kernels, options, sync)
    make = kernels.get("rule")
    betas = []
    for s, prod in zip(sums, prods, strict=True):  # the linearised numerator: lr, weight
        # decay and r are in the sums; a scope's first step (its product still 1) is the
        # rule's fourth input
        first = (prod == 1.0).to(s.dtype).reshape(-1, 1).expand(s.shape[0], 1)
        s4 = torch.cat([s, first], 1)
        one = _fused_rule(make, _rule.adam_beta, config, s4, 1, s.dtype, interpret, "first")
        if one is None:
            first_k = s4[:, 3] if s.dim() == 2 else s4[..., 3]
            betas.append(_rule.adam_beta(torch, s, config, lr=lr, weight_decay=wd, first=first_k))
        else:
            betas.append(one[0])
    apply = kernels["adam_apply"]
    for launch, grids in plan.grids:
        ct = tl_dtypes[torch.float64 if launch.dtype == torch.float64 else torch.float32]
        for blocks, count, masked in grids:
            apply[(count,)](
                launch.table,
                blocks,
                bias2,
                corrections[launch.array],
                betas[launch.array],
                scale,
                inf,
                beta2,
                1.0 - beta2,
                eps,
                lam,
                l2,
                lr,
                decay,
                DT=tl_dtypes[launch.dtype],
                CT=ct,
                BLOCK=BLOCK,
                CHUNK=CHUNK,
                MASKED=masked,
                ALIGNED=launch.aligned,
                HAS_INF=found_inf is not None,
                DECAY=decay_mode,
                **flags,
                **options,
            )
    new_prods = [
        _keep_where_skipped(prod, prod * beta, found_inf)
        for prod, beta in zip(prods, betas, strict=True)
    ]
    return betas, new_prods


def _check_adam_hyper(name: str, h: AdamHyper) -> AdamHyper:
    lr, beta2, eps, weight_decay, weight_decay_mode, maximize, config, lr_ratio = h
    if not isinstance(config, AMConfig):
        raise TypeError(f"{name}: config must be an AMConfig; got {config!r}")
    check_choice("weight_decay_mode", weight_decay_mode, _rule.WEIGHT_DECAY_MODES)
    return AdamHyper(
        check_nonnegative("lr", lr),
        check_nonnegative("beta2", beta2),
        check_nonnegative("eps", eps),
        check_nonnegative("weight_decay", weight_decay),
        weight_decay_mode,
        check_bool("maximize", maximize),
        config,
        check_nonnegative("lr_ratio", lr_ratio),
    )


def triton_am_adamw(
    t: AdamTensors,
    h: AdamHyper,
    amp: Scaler = NO_SCALER,
    *,
    plan: Plan | None = None,
    state: GroupState | None = None,
    sync: Any = None,
) -> tuple[list[Tensor], list[Tensor]]:
    r"""AM-AdamW / AM-Adam step over one param group with the Triton kernels, in place.

    The same step as ``am_adamw(..., foreach=False)`` (``docs/algorithms.md``,
    section 3): :math:`v \leftarrow \beta_2 v + (1-\beta_2) g^2`,
    :math:`p = c(\epsilon + \sqrt{v/(1-\beta_2^t)})` with :math:`c = 1 -
    \beta_{1,\max}\pi`, the sums ``N, D, ref`` (:func:`amopt.core.rule.adam_weights`),
    :math:`\beta` from :func:`amopt.core.rule.adam_beta`, :math:`d \leftarrow g +
    \frac{\beta + \lambda p}{1 + \lambda p}(d - g)`, then the decay and
    :math:`x \leftarrow x - \eta d / p`, and :math:`\pi \leftarrow \pi\beta`.

    Parameters
    ----------
    t : AdamTensors
        ``params`` (updated in place) and ``grads``: contiguous, same shape and dtype,
        on one CUDA device (see :func:`available`); ``exp_avgs``, ``exp_avg_sqs``:
        :math:`d` and :math:`v` in the parameter dtype (zeros before the first step),
        updated in place; ``state_steps``: 0-d step counters (CPU or device),
        incremented in place (not on a skipped step); ``beta1_prods``: 0-d running
        products :math:`\pi` (ones before the first step; with a global scope the
        first entry is the scope's product).
    h : AdamHyper
        ``lr, beta2, eps, weight_decay, maximize`` as in :class:`~amopt.torch.AMAdamW`;
        ``weight_decay_mode`` in ``{"decoupled", "proximal", "l2"}`` (``"l2"`` is
        AM-Adam: :math:`\mu x` is added to the gradient first, and the rule and update
        see no decay); ``config``: ``lam``, ``beta_max`` (:math:`\beta_{1,\max}`),
        ``per_layer`` and the variant (the numerator is always the linearised one).
    amp : Scaler, optional
        As in :func:`triton_amsgd`; a skipped step also keeps the moments and products.
    plan, state, sync
        As in :func:`triton_amsgd`; with ``state``, its ``prods`` and ``betas`` are
        updated in place (a skipped step keeps both) and returned.

    Returns
    -------
    betas, beta1_prods : list of Tensor
        Per parameter, the 0-d beta of its scope and the scope's new product, in
        the compute dtype (shared tensors when ``config.per_layer`` is False).
        On a skipped step the betas are not applied and the products are the old ones.
    """
    name = "triton_am_adamw"
    grad_scale, found_inf = amp
    if plan is not None and state is not None and state.prods is not None:
        h = _check_adam_hyper(name, h)
        with torch.no_grad():
            betas, prods = _adam_core(_in_use(plan), state.steps, state.prods, h, amp, sync)
            for old, beta in zip(state.betas, betas, strict=True):
                old.copy_(_keep_where_skipped(old, beta, found_inf))
            for old, prod in zip(state.prods, prods, strict=True):
                old.copy_(prod)
            _advance(state.steps, found_inf)
        _written(t.params)
        return state.betas, state.prods
    params, grads, exp_avgs, exp_avg_sqs, state_steps, beta1_prods = t
    _check_lists(
        name,
        params,
        grads=grads,
        exp_avgs=exp_avgs,
        exp_avg_sqs=exp_avg_sqs,
        state_steps=state_steps,
        beta1_prods=beta1_prods,
    )
    h = _check_adam_hyper(name, h)
    n = len(params)
    if n == 0:
        return [], []
    columns = [params, grads, exp_avgs, exp_avg_sqs]
    plan = _checked_plan(columns, h.config.per_layer)
    if plan is None:
        _check_like(name, params, grads=grads, exp_avgs=exp_avgs, exp_avg_sqs=exp_avg_sqs)
        _require(name, [*params, *grads, *exp_avgs, *exp_avg_sqs])
    device = params[0].device
    amp = Scaler(
        _scaler_tensor("grad_scale", grad_scale, device),
        _scaler_tensor("found_inf", found_inf, device),
    )
    with torch.no_grad():
        if plan is None:
            plan = _plan(columns, h.config.per_layer)
        prods = [
            _stacked([beta1_prods[i] for i in rows], device, acc)
            for rows, (acc, *_) in zip(plan.rows, plan.arrays, strict=True)
        ]
        steps = _stacked_steps(state_steps, device)
        betas, new_prods = _adam_core(plan, steps, prods, h, amp, sync)
        _written(params)
        _count_step(state_steps, amp.found_inf)
        return (
            _per_tensor(betas, plan, h.config.per_layer),
            _per_tensor(new_prods, plan, h.config.per_layer),
        )


# --------------------------------------------------------------------------- optimizer groups


class GroupPlan:
    """A param group's Triton step, ready to launch at every step of an optimizer.

    Built by :func:`group_plan` after a step of the group (its state then exists):
    the :class:`Plan` of the group's tensors (parameters with a gradient, their
    gradients and state buffers) and a :class:`GroupState` into which the group's
    0-d state entries (``step``, ``beta`` and AM-Adam(W)'s ``beta1_prod``) are moved:
    every ``optimizer.state[p]`` entry becomes a view of it, so that the entries keep
    the values of the step as ``torch.optim`` state does (``state_dict``, schedulers,
    checkpoints) while a step updates them with a few device operations. The counters
    move to the parameters' device, as those of ``torch.optim.AdamW(fused=True)``.

    :meth:`grads` is the check of each step: the gradients of the same parameters,
    the parameters at the addresses the plan was built with, no new gradient on a
    parameter the plan leaves out. Gradients that are new tensors (``zero_grad()``
    sets them to ``None``, and backward allocates them again, often elsewhere) only
    have their addresses compared and, where they moved, written into the tables
    (:func:`rebind`: no new plan, no synchronisation). Anything else (``p.data``
    elsewhere, a parameter without its gradient, a non-contiguous gradient, a
    changed param group) returns ``None`` and the optimizer takes its general step,
    which builds a new plan.

    Sharded groups (``DTensor`` parameters of FSDP2 or tensor parallelism, or plain
    partitions combined over a process group) are planned the same way over the
    local tensors: ``sharded`` (``amopt.torch._records.Sharded``) says how a step finds
    its local gradients and holds the group's ``ScopeSync`` (``amopt.torch._distributed``),
    with which the step adds the sums of each scope over its ranks between the
    reduce and the rule.
    """

    __slots__ = (
        "copied",
        "flags",
        "grad_ptrs",
        "grads_seen",
        "group_params",
        "idle",
        "local_grads",
        "n_group",
        "param_ptrs",
        "params",
        "plan",
        "sharded",
        "state",
        "tensors",
    )

    def __init__(
        self,
        flags: tuple,
        group_params: list[Tensor],
        params: list[Tensor],
        grads: list[Tensor],
        tensors: tuple,
        plan: Plan,
        state: GroupState,
        sharded: Sharded | None = None,
    ) -> None:
        self.flags = flags
        self.group_params = group_params
        self.n_group = len(group_params)
        self.params = params
        self.idle = [p for p in group_params if all(p is not q for q in params)]
        self.sharded = sharded
        self.grads_seen = list(grads)
        self.local_grads = list(grads) if sharded is None else sharded.local_grads
        self.param_ptrs = self._param_ptrs()
        self.grad_ptrs = [g.data_ptr() for g in self.local_grads]
        self.copied = sharded is not None and _copied(grads, self.grad_ptrs)
        self.tensors = tensors
        self.plan = plan
        self.state = state

    @property
    def sync(self) -> Any:
        """The ``ScopeSync`` of a sharded group (``None``: every scope is local)."""
        return None if self.sharded is None else self.sharded.sync

    @property
    def local_params(self) -> list[Tensor]:
        """The tensors the kernels update: the parameters, or their local pieces."""
        return self.params if self.sharded is None else self.sharded.local_params

    def _param_ptrs(self) -> list[int]:
        locals_ = (
            self.params if self.sharded is None else map(self.sharded.local_of_param, self.params)
        )
        return list(map(Tensor.data_ptr, locals_))

    def grads(self, group: dict[str, Any], flags: tuple) -> list[Tensor] | None:
        """This step's (local) gradients if the plan still describes the group, else ``None``."""
        if flags != self.flags or group["params"] is not self.group_params:
            return None
        if len(self.group_params) != self.n_group:
            return None
        grads = [p.grad for p in self.params]
        if self._param_ptrs() != self.param_ptrs:
            return None
        for p in self.idle:
            if p.grad is not None:
                return None
        same = all(map(operator.is_, grads, self.grads_seen)) and not self.copied
        if same and self.sharded is None:  # the same tensors, their storage not swapped
            same = list(map(Tensor.data_ptr, grads)) == self.grad_ptrs
        if not same:
            try:  # data_ptr raises for None and for sparse layouts (no storage)
                sharded = self.sharded
                local = grads if sharded is None else sharded.local_of_grads(self.params, grads)
                ptrs = list(map(Tensor.data_ptr, local))
                if not all(map(Tensor.is_contiguous, local)):
                    return None
            except (AttributeError, RuntimeError, TypeError, ValueError):
                return None
            if ptrs != self.grad_ptrs:
                # gradients allocated elsewhere (autograd gives them the parameters' shape
                # and dtype): their column of the address tables is rewritten in place
                if not rebind(self.plan, 1, ptrs):
                    self.plan = build_plan(
                        [self.local_params, local, *self.tensors],
                        self.plan.per_layer,
                        self.plan.wide,
                    )
                self.grad_ptrs = ptrs
            self.grads_seen = grads
            self.local_grads = local
            self.copied = sharded is not None and _copied(grads, ptrs)
        return self.local_grads


def _copied(grads: Sequence[Tensor], local_ptrs: Sequence[int]) -> bool:
    """Whether a sharded group's local gradient (at ``local_ptrs``) is a copy of its
    gradient (a ``DTensor`` gradient redistributed to its parameter's placements), which
    an update of the gradient in place (``zero_grad(set_to_none=False)``, accumulation)
    does not reach: such a group finds its local gradients anew at every step."""
    return any(
        getattr(g, "_local_tensor", g).data_ptr() != ptr
        for g, ptr in zip(grads, local_ptrs, strict=True)
    )


def group_plan(
    kind: str,
    optimizer_state: Any,
    group: dict[str, Any],
    flags: tuple,
    params: list[Tensor],
    grads: list[Tensor],
    buffers: list[list[Tensor]],
    sharded: Sharded | None = None,
) -> GroupPlan | None:
    """The :class:`GroupPlan` of a group that has just stepped on the Triton path.

    ``kind``: ``"sgd"`` (``buffers``: the momentum buffers) or ``"adam"``
    (``exp_avgs, exp_avg_sqs``). ``None`` where the tensors do not qualify (see
    :func:`available`). A sharded group's plan is built over its local tensors
    (``sharded``: ``amopt.torch._records.Sharded``).
    """
    local_params, local_grads = params, grads
    if sharded is not None:
        local_params, local_grads, buffers = sharded[:3]
    tensors = [local_params, local_grads, *buffers]
    if not params or available([t for col in tensors for t in col]):
        return None
    per_layer = bool(group["per_layer"])
    with torch.no_grad():
        plan = build_plan(tensors, per_layer, wide=kind == "sgd")
        device = plan.device
        states = [optimizer_state[p] for p in params]
        steps = torch.stack([s["step"].detach().reshape(()).to(device) for s in states])

        def gathered(key: str, dtypes: list[torch.dtype]) -> list[Tensor]:
            return [
                torch.stack([states[r][key].detach().reshape(()).to(device, dt) for r in rows])
                for rows, dt in zip(plan.rows, dtypes, strict=True)
            ]

        betas = gathered("beta", plan.out_dtypes)
        prods = (
            gathered("beta1_prod", [acc for acc, *_ in plan.arrays]) if kind == "adam" else None
        )
        views = {"beta": [b.unbind() for b in betas]}
        if prods is not None:
            views["beta1_prod"] = [p.unbind() for p in prods]
        for state, step in zip(states, steps.unbind(), strict=True):
            state["step"] = step
        for i, (a, s) in enumerate(plan.scope_of):
            for key, per_array in views.items():
                states[i][key] = per_array[a][s]
        if not per_layer:  # members without a gradient now share the scope's entries
            for p in group["params"]:
                state = optimizer_state.get(p)
                if state and all(p is not q for q in params):
                    for key, per_array in views.items():
                        if key in state:
                            state[key] = per_array[0][0]
    return GroupPlan(
        flags,
        group["params"],
        list(params),
        grads,
        tuple(buffers),
        plan,
        GroupState(steps, prods, betas),
        sharded,
    )
