"""The AM-MGD rule on CuPy arrays as one kernel, generated from the rule's tape.

The pipelined loop of :func:`amopt.minimize` runs the rule on the device
(``amopt.optimize.split.am_momentum_apply``). As array operations on 0-d arrays that is about
twenty kernel launches per iteration, each some microseconds of Python and CUDA on the
host. Here the rule, from the split's three dots of each scope (and the decrease of f
for the exact numerator) to beta and gamma, is recorded once as a tape
(:mod:`amopt.core.tape`, from the rule in :mod:`amopt.core.rule` when the step runs) and
compiled into one ``cupy.ElementwiseKernel`` over the scopes: the same IEEE operations
in the same order, bit for bit the host rule's values (:func:`amopt.core.tape.c_source`).

A rule that cannot be recorded, or a kernel that CuPy cannot build, leaves the rule to
the array operations (the latter with one warning per process).
"""

from __future__ import annotations

from typing import Any

from amopt.backends.fallback import KernelCache
from amopt.core import tape as _tape

__all__ = ["momentum_rule", "source"]


def source(rule: Any, config: Any, lr: float, exact: bool) -> str | None:
    """The kernel body: ``beta`` and ``gamma`` of scope ``i`` from ``s[3 i + k]`` (the
    three dots) and ``fd[0]`` (the decrease of f, with ``exact``); None where the rule
    cannot be recorded."""
    tape = _tape.momentum_of_dots(rule, config, lr, exact)
    if tape is None:
        return None
    inputs = ["s[3 * i]", "s[3 * i + 1]", "s[3 * i + 2]", "fd[0]"]
    return _tape.c_source(*tape, inputs, ("beta", "gamma"))


#: kernels by (rule, config, lr, exact); None where none could be made
_KERNELS = KernelCache("the AM rule's fused CuPy kernel", "the rule runs as array operations")


def _build(rule: Any, config: Any, lr: float, exact: bool) -> Any:
    body = source(rule, config, lr, exact)
    if body is None:
        return None
    import cupy

    params = "raw float64 s, raw float64 fd" if exact else "raw float64 s"
    return cupy.ElementwiseKernel(
        params, "float64 beta, float64 gamma", body, "amopt_am_momentum_rule"
    )


def _kernel(rule: Any, config: Any, lr: float, exact: bool) -> Any:
    key = (rule, config, float(lr), exact)
    return _KERNELS.get(key, lambda: _build(rule, config, lr, exact))


def momentum_rule(
    rule: Any, sums: list, config: Any, lr: float, f_decrease: Any
) -> tuple[Any, Any] | None:
    """``(beta, gamma)`` per scope (float64 CuPy arrays) from the split's 0-d dots
    ``sums`` (three per scope) and the 0-d float64 ``f_decrease`` (None: linearised),
    in one kernel; None where the rule is left to the array operations."""
    import cupy

    exact = f_decrease is not None
    try:
        kernel = _kernel(rule, config, lr, exact)
        if kernel is None:
            return None
        s = cupy.stack(sums)
        if s.dtype != cupy.float64:
            s = s.astype(cupy.float64)
        args = (s, cupy.reshape(f_decrease, (1,))) if exact else (s,)
        return kernel(*args, size=len(sums) // 3)
    except Exception as exc:  # noqa: BLE001 - a kernel CuPy cannot build or run
        _KERNELS.failed((rule, config, float(lr), exact), exc)
        return None
