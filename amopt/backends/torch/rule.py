"""The AM-MGD rule on torch CUDA tensors as one Triton kernel, generated from the rule's tape.

The counterpart of :mod:`amopt.backends.cupy.rule` for torch: the pipelined loop of
:func:`amopt.minimize` runs the rule on the device (``amopt.optimize.split.am_momentum_apply``),
which as tensor operations on 0-d tensors is about twenty-five kernel launches per
iteration. Here the rule, from the split's three dots of each scope (and the decrease of
f for the exact numerator) to beta and gamma, is recorded once as a tape
(:mod:`amopt.core.tape`) and written out as a Triton kernel over the scopes
(:func:`amopt.backends.triton.triton_kernel`, compiled without contraction into multiply-adds):
the same IEEE operations in the same order in float64, bit for bit the rule's values.

It runs on CUDA tensors where Triton is usable (:func:`amopt.backends.library_available`),
and on CPU tensors only when the tests ask
for it (:data:`FORCE`, under ``TRITON_INTERPRET=1``). A rule that cannot be recorded
leaves the rule to the tensor operations, as does a kernel that Triton cannot build (with
one warning per process).
"""

from __future__ import annotations

from typing import Any

from amopt import backends
from amopt.backends import triton as _triton
from amopt.backends.fallback import KernelCache
from amopt.core import tape as _tape

__all__ = ["applies", "momentum_rule"]

#: scopes per program of a rule kernel
BLOCK = 128
#: run on CPU tensors too (the tests, with ``TRITON_INTERPRET=1``)
FORCE = False

#: kernels by (rule, config, lr, exact, interpreted); None where none could be made
_KERNELS = KernelCache("the AM rule's Triton kernel", "the rule runs as tensor operations")

#: whether Triton's interpreter is on (the optimizers' Triton drivers ask here too)
_interpret = _triton.interpret


def rule_options(interpret: bool) -> dict[str, Any]:
    """Launch options of a rule kernel: no contraction into multiply-adds."""
    return {} if interpret else {"num_warps": 1, "enable_fp_fusion": False}


def run_rule(kernel: Any, sums: Any, n_out: int, out: Any, interpret: bool) -> Any:
    """``(n_out, n_scopes)`` outputs, of torch dtype ``out``, of a rule kernel
    (:func:`amopt.backends.triton.triton_kernel`) on the ``(n_scopes, K)`` sums of every scope:
    the launcher of this module's kernel and of the optimizers' Triton drivers."""
    import torch
    import triton.language as tl

    n = sums.shape[0]
    result = torch.empty((n_out, n), dtype=out, device=sums.device)
    out_tl = {torch.float64: tl.float64, torch.float32: tl.float32}[out]
    kernel[((n + BLOCK - 1) // BLOCK,)](
        sums, result, n, K=sums.shape[1], OUT=out_tl, BLOCK=BLOCK, **rule_options(interpret)
    )
    return result


def applies(t: Any) -> bool:
    """Whether the rule of sums like ``t`` (a torch tensor) runs in the kernel."""
    return t.device.type == "cuda" or FORCE


def _build(rule: Any, config: Any, lr: float, exact: bool, interpret: bool) -> Any:
    tape = _tape.momentum_of_dots(rule, config, lr, exact)
    return None if tape is None else _triton.triton_kernel(*tape, "float64", interpret)


def _kernel(rule: Any, config: Any, lr: float, exact: bool) -> Any:
    if not backends.library_available("triton"):  # the tensor operations, without a warning
        return None
    key = (rule, config, float(lr), exact, _interpret())
    return _KERNELS.get(key, lambda: _build(*key))


def momentum_rule(
    rule: Any, sums: list, config: Any, lr: float, f_decrease: Any
) -> tuple[Any, Any] | None:
    """``(beta, gamma)`` per scope (float64 tensors) from the split's 0-d dots ``sums``
    (three per scope) and the 0-d float64 ``f_decrease`` (None: linearised), in one
    kernel; None where the rule is left to the tensor operations (tensors off CUDA
    among them, unless :data:`FORCE`)."""
    import torch

    if not applies(sums[0]):
        return None
    exact = f_decrease is not None
    try:
        kernel = _kernel(rule, config, lr, exact)
        if kernel is None:
            return None
        n = len(sums) // 3
        s = torch.stack(sums).to(torch.float64).view(n, 3)
        if exact:  # the decrease of f as every scope's fourth input
            s = torch.cat([s, f_decrease.reshape(1, 1).expand(n, 1)], 1)
        out = run_rule(kernel, s, 2, torch.float64, _interpret())
        return out[0], out[1]
    except Exception as exc:  # noqa: BLE001 - a kernel Triton cannot build or run here
        _KERNELS.failed((rule, config, float(lr), exact, _interpret()), exc)
        return None
