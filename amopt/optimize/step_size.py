r"""The step size of a first-order method of ``amopt.minimize`` when ``lr`` is not given.

:math:`\eta = 1/L` is the step of the convergence theory of every full-batch method
here (GD, heavy ball, Nesterov, AM-MGD) on an :math:`L`-smooth objective. When the
objective knows its :math:`L` (an ``L`` attribute: every :mod:`amopt.problems`
class but Rosenbrock), it is used; otherwise :math:`L` is estimated at ``x0``:

1. a power iteration on the Hessian through gradient differences,
   :math:`w_k = (\nabla f(x_0 + h v_k) - \nabla f(x_0)) / h`,
   :math:`v_{k+1} = w_k / \|w_k\|`, from :math:`v_0 = \nabla f(x_0)/\|\nabla f(x_0)\|`,
   with :math:`h = 10^{-4} \max(1, \|x_0\|)`, until :math:`\|w_k\|` changes by less
   than 1% (at most 20 gradients): :math:`\hat L = \|w_k\|`, the largest curvature
   at :math:`x_0` (exact on a quadratic, up to the convergence of the iteration);
2. a safeguard: :math:`\eta = 1/\hat L` is halved until the gradient step from
   :math:`x_0` decreases f by at least :math:`\frac{\eta}{2}\|\nabla f(x_0)\|^2`
   (Armijo's condition, which every step of length :math:`\le 1/L` meets).

The evaluations are counted in the result's ``nfev`` and ``njev``. A run whose
objective is much more curved away from ``x0`` than at it may still need a
smaller ``lr``; such a run ends with status 2 (see ``STATUS_MESSAGES``), not in
silence.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

from scipy.optimize import OptimizeWarning

from amopt.optimize.loop import _Layout, _Objective

__all__ = ["default_lr"]

#: relative change of the curvature estimate that ends the power iteration
_RTOL = 1e-2
_MAX_POWER = 20
_MAX_HALVINGS = 60


def known_L(fun: Any) -> float | None:
    """``fun.L`` when it is a finite positive number, else None."""
    L = getattr(fun, "L", None)
    if isinstance(L, numbers.Real) and not isinstance(L, bool) and math.isfinite(L) and L > 0:
        return float(L)
    return None


def default_lr(
    fun: Any, x0: Any, args: tuple, jac: Any, *, weight_decay: float = 0.0
) -> tuple[float, int, int, str]:
    """``(lr, nfev, njev, how)``: :math:`1/(L + \\mu)` for coupled decay :math:`\\mu`.

    ``how`` says where :math:`L` came from (``"fun.L"`` or ``"estimated"``; ``"none"``
    where x0 or the objective there is not finite: the run stops before any step).
    """
    L = known_L(fun)
    if L is not None:
        return 1.0 / (L + weight_decay), 0, 0, "fun.L"
    layout = _Layout(x0)
    with warnings.catch_warnings():
        # the run itself gives the finite-difference warning, once
        warnings.simplefilter("ignore", OptimizeWarning)
        obj = _Objective(fun, jac, args, layout)
    if obj.finite_sum and not hasattr(fun, "value_and_grad"):
        raise ValueError("lr was not given and fun has no value_and_grad to estimate L from")
    xs = layout.arrays
    if not layout.all_finite(xs):  # the run stops at x0 with status 2, before any step
        return 1.0, 0, 0, "none"
    f0, g0 = obj(xs)
    f0 = float(f0)
    g0 = tuple(g + weight_decay * x for g, x in zip(g0, xs, strict=True)) if weight_decay else g0
    g_sq = layout.sq_norm(g0)
    if not (math.isfinite(f0) and math.isfinite(g_sq)):
        # the run meets the same value at x0 and stops there with status 2
        return 1.0, obj.nfev, obj.njev, "none"
    if g_sq == 0.0:  # x0 is stationary: any step leaves it where it is
        return 1.0, obj.nfev, obj.njev, "estimated"
    h = 1e-4 * max(1.0, math.sqrt(layout.sq_norm(xs)))
    v = tuple(g / math.sqrt(g_sq) for g in g0)
    L_hat = 0.0
    for _ in range(_MAX_POWER):
        _, g_h = obj(tuple(x + h * d for x, d in zip(xs, v, strict=True)))
        if weight_decay:
            g_h = tuple(g + weight_decay * (x + h * d) for g, x, d in zip(g_h, xs, v, strict=True))
        w = tuple((a - b) / h for a, b in zip(g_h, g0, strict=True))
        norm = math.sqrt(layout.sq_norm(w))
        if not math.isfinite(norm) or norm == 0.0:
            break
        done = abs(norm - L_hat) <= _RTOL * norm
        L_hat, v = norm, tuple(a / norm for a in w)
        if done:
            break
    lr = 1.0 / L_hat if L_hat > 0 else 1.0
    for _ in range(_MAX_HALVINGS):
        # Armijo on the gradient step from x0 (of F = f + wd/2 |x|^2 under coupled decay)
        trial = tuple(x - lr * g for x, g in zip(xs, g0, strict=True))
        f_t, _ = obj(trial)
        f_t = float(f_t)
        if weight_decay:
            f_t += 0.5 * weight_decay * (layout.sq_norm(trial) - layout.sq_norm(xs))
        if math.isfinite(f_t) and f_t <= f0 - 0.5 * lr * g_sq:
            return lr, obj.nfev, obj.njev, "estimated"
        lr *= 0.5
    raise ValueError(
        "lr was not given, and no step size down to "
        f"{lr:.3g} decreases f from x0 along the gradient; pass options={{'lr': ...}}"
    )
