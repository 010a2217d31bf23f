"""The Triton emitter of a recorded rule: a tape written out as one Triton kernel.

A rule recorded by :mod:`amopt.core.tape` is a list of IEEE operations; here it becomes
the source of a Triton kernel that evaluates every scope in one launch, each operation
rounding once in the tape's dtype (float64 or float32), compiled without contraction
into multiply-adds. :mod:`amopt.backends.torch.rule` (the rule of ``minimize``'s loop on
torch CUDA tensors) and the optimizers' Triton drivers (:mod:`amopt.torch._triton`)
launch it.

Whether Triton can be used here is :func:`amopt.backends.library_available`'s answer
(``"triton"``), decided once per process; whether its interpreter is on,
:func:`interpret`.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from amopt.core.tape import OPS

__all__ = ["interpret", "triton_kernel", "triton_source"]


def interpret() -> bool:
    """Whether Triton's interpreter is on (``TRITON_INTERPRET``), as ``triton.jit`` reads it."""
    try:
        from triton import knobs
    except ImportError:  # pragma: no cover - Triton before knobs
        return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
    return bool(knobs.runtime.interpret)


#: One Triton expression per operation, on ``[BLOCK]`` tensors of the tape's dtype
#: (launched with ``enable_fp_fusion=False``: no multiply-add is contracted). float64
#: ``/`` is IEEE division; float32's needs ``div_rn`` (Triton's own is approximate).
_TRITON_OPS = {
    "add": "{a} + {b}",
    "sub": "{a} - {b}",
    "mul": "{a} * {b}",
    "div": "{a} / {b}",
    "le": "tl.where({a} <= {b}, ONE, ZERO)",
    "ge": "tl.where({a} >= {b}, ONE, ZERO)",
    "lt": "tl.where({a} < {b}, ONE, ZERO)",
    "gt": "tl.where({a} > {b}, ONE, ZERO)",
    "eq": "tl.where({a} == {b}, ONE, ZERO)",
    "ne": "tl.where({a} != {b}, ONE, ZERO)",
    "where": "tl.where({a} != ZERO, {b}, {c})",
    "isnan": "tl.where({a} != {a}, ONE, ZERO)",
    "maximum": "tl.where(({a} != {a}) | ({a} >= {b}), {a}, {b})",
    "minimum": "tl.where(({a} != {a}) | ({a} <= {b}), {a}, {b})",
    "neg": "-{a}",
}


#: compiled rule kernels by (name, interpreted): one per tape and dtype, whichever rule,
#: configuration or driver recorded it
_TRITON_KERNELS: dict[tuple[str, bool], Any] = {}


def triton_kernel(code: np.ndarray, outputs: np.ndarray, dtype: Any, interpret: bool) -> Any:
    """:func:`triton_source` of a tape compiled by ``triton.jit``, once per tape, dtype
    and ``interpret`` (whether Triton's interpreter is on, which ``triton.jit`` reads
    when it is called); None for a tape it cannot write. The name is a hash of the tape
    and the dtype; the source, made here from the recorded operations and never read
    from elsewhere, goes into ``linecache`` so that ``triton.jit`` finds what it
    compiles."""
    import hashlib
    import linecache

    digest = hashlib.sha256(code.tobytes() + outputs.tobytes() + np.dtype(dtype).str.encode())
    name = "amopt_rule_" + digest.hexdigest()[:16]
    key = (name, interpret)
    if key in _TRITON_KERNELS:
        return _TRITON_KERNELS[key]
    import triton
    import triton.language

    source = triton_source(code, outputs, dtype, name)
    kernel = None
    if source is not None:
        filename = f"<amopt rule kernel {name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace: dict[str, Any] = {"tl": triton.language}
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102
        kernel = triton.jit(namespace[name])
    _TRITON_KERNELS[key] = kernel
    return kernel


def triton_source(code: np.ndarray, outputs: np.ndarray, dtype: Any, name: str) -> str | None:
    """A recorded tape as the source of a Triton kernel ``name``, one scope per lane.

    ``name(s_ptr, out_ptr, n, K, OUT, BLOCK)``: scope ``i < n`` reads its sums
    ``s_ptr[i K + k]``, evaluates the tape in ``dtype`` (float32 or float64: every
    operation rounds once in it, as the array operations of the rule do) and writes
    output ``j`` to ``out_ptr[j n + i]`` in ``OUT``. None for a tape with a non-finite
    constant (the rules have none).
    """
    dt = {np.dtype(np.float64): "tl.float64", np.dtype(np.float32): "tl.float32"}.get(
        np.dtype(dtype)
    )
    if dt is None:
        return None
    div = "{a} / {b}" if dt == "tl.float64" else "tl.math.div_rn({a}, {b})"
    lines = [
        f"def {name}(s_ptr, out_ptr, n, K: tl.constexpr, OUT: tl.constexpr, BLOCK: tl.constexpr):",
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
        "    m = offs < n",
        f"    ZERO = tl.full([BLOCK], 0.0, {dt})",
        f"    ONE = tl.full([BLOCK], 1.0, {dt})",
    ]
    for i, (op, a, b, c, k) in enumerate(code.tolist()):
        op_name = OPS[op]
        if op_name == "in":
            expr = f"tl.load(s_ptr + offs * K + {a}, mask=m, other=0.0).to({dt})"
        elif op_name == "const":
            if not math.isfinite(k):
                return None
            expr = f"tl.full([BLOCK], {k!r}, {dt})"
        else:
            form = div if op_name == "div" else _TRITON_OPS[op_name]
            expr = form.format(a=f"r{a}", b=f"r{b}", c=f"r{c}")
        lines.append(f"    r{i} = {expr}")
    for j, o in enumerate(outputs.tolist()):
        lines.append(f"    tl.store(out_ptr + {j} * n + offs, r{o}.to(OUT), mask=m)")
    return "\n".join(lines) + "\n"
