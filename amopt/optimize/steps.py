r"""The Adaptive Memory rules, once, as pure functions over the Python array API.

Every function here takes parameters, gradients and state and returns new
ones; nothing is modified in place, so the same code runs on NumPy, CuPy,
torch tensors and array-api-strict. ``amopt.minimize``, the torch optimizers
and the benchmarks are thin surfaces over (or are tested step by step
against) these functions. The rules are those of ``docs/algorithms.md``.

Parameters are passed as a single array or as a sequence of arrays (a
"parameter list"). The *beta scope* is the set of coordinates one beta is
computed over: all arrays together (``per_layer=False``, "global") or each
array on its own (``per_layer=True``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from amopt import backends
from amopt.backends import plain_namespace
from amopt.core import rule as _rule
from amopt.core.config import AMConfig, config_of_call, rule_keywords
from amopt.core.reduce import (
    Array,
    accumulation_dtype,
    adam_sums,
    as_tuple,
    cast,
    compute_dtype,
    momentum_sums,
    restore,
    row,
    scopes,
)
from amopt.core.rule import NUMERATORS, VARIANTS
from amopt.core.xp import array_namespace

__all__ = [
    "AMState",
    "HeavyBallState",
    "AdamState",
    "AMAdamState",
    "am_beta",
    "am_adam_beta",
    "apply_variant",
    "gd_step",
    "heavy_ball_init",
    "heavy_ball_step",
    "classical_momentum_step",
    "am_momentum_init",
    "am_momentum_step",
    "adam_init",
    "adam_step",
    "am_adam_init",
    "am_adam_step",
    "VARIANTS",
    "NUMERATORS",
]


class _Bounds(NamedTuple):
    """The rule's parameters as given, unvalidated, for the building blocks ``am_beta`` and
    ``am_adam_beta`` (whose ``beta_max`` may exceed 1 to expose the raw ratio)."""

    lam: float
    beta_max: float
    variant: None = None


def _copy(xp: Any, a: Array) -> Array:
    return xp.asarray(a, copy=True)


# --------------------------------------------------------------------------- beta rules


def am_beta(
    g: Any,
    d: Any,
    *,
    lam: float = 0.0,
    beta_max: float = 1.0,
    lr: float | None = None,
    f_decrease: Any = None,
) -> Array:
    r"""Adaptive Memory momentum coefficient over one beta scope (AM-MGD / AM-MSGD).

    .. math::

        v = d - g, \qquad
        \beta = \operatorname{clip}\Big(\frac{\text{num}}{\langle v, v\rangle},
        0, \beta_{\max}\Big),

    with the exact numerator
    :math:`\text{num} = (f_{\text{prev}} - f)(1+\lambda)/\eta - \langle v, g + \lambda d\rangle`
    when ``f_decrease`` :math:`= f_{\text{prev}} - f` is given, and the
    linearised numerator :math:`(1+\lambda)\langle g, g\rangle - \lambda\langle v, v\rangle`
    otherwise. ``beta = 0`` when :math:`\langle v,v\rangle \le \epsilon^2
    (\langle d,d\rangle + \langle g,g\rangle)` (this covers ``d = g`` and
    ``d = g = 0``); a NaN never comes out. This is :func:`amopt.core.reduce.momentum_sums`
    followed by the one rule, :func:`amopt.core.rule.momentum_beta`.

    Parameters
    ----------
    g, d : array or sequence of arrays
        Gradient and momentum buffer; all arrays form one scope.
    lam : float
        Proximal regularisation :math:`\lambda \ge 0`.
    beta_max : float
        Upper clipping bound.
    lr : float, optional
        Step size :math:`\eta`; required with ``f_decrease``.
    f_decrease : scalar, optional
        :math:`f(x_{t-1}) - f(x_t)` for the exact numerator.

    Returns
    -------
    beta : 0-d array
        In the accumulation dtype (:func:`amopt.core.reduce.accumulation_dtype`: float64
        wherever the arrays' device has it).

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import am_beta
    >>> g, d = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    >>> float(am_beta(g, d))  # <g,g> / ||d-g||^2
    0.5
    """
    gs, _ = as_tuple(g)
    ds, _ = as_tuple(d)
    xp = array_namespace(*gs, *ds)
    cfg = _Bounds(float(lam), float(beta_max))
    exact = f_decrease is not None
    sums = momentum_sums(xp, gs, ds, [tuple(range(len(gs)))], exact=exact)
    beta, _ = _rule.momentum_beta(xp, row(sums, 0), cfg, lr=lr, f_decrease=f_decrease)
    return beta


def apply_variant(
    beta: Array,
    variant: str | None,
    *,
    beta_min: float = 0.5,
    theta: float = 0.7,
    beta_high: float = 0.9,
    beta_low: float = 0.1,
) -> Array:
    r"""The "what matters when adapting beta" variants of the paper.

    ``"clip"``: :math:`\max(\beta_{AM}, \beta_{\min})`;
    ``"restart"``: :math:`\beta_{high}` if :math:`\beta_{AM} \ge \theta` else :math:`\beta_{low}`;
    ``None``: :math:`\beta_{AM}` unchanged. (:func:`amopt.core.rule.apply_variant`.)

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import apply_variant
    >>> float(apply_variant(np.asarray(0.75), "restart"))
    0.9
    """
    cfg = AMConfig.from_options(locals())
    return _rule.apply_variant(array_namespace(beta), beta, cfg)


# --------------------------------------------------------------------------- GD / heavy ball


class HeavyBallState(NamedTuple):
    """State of the damped heavy ball: steps taken and the momentum buffer ``d``.

    ``d`` holds zeros before the first step (which sets ``d = g``): the state has the
    same structure at every step.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import heavy_ball_init, heavy_ball_step
    >>> x = np.array([1.0, -2.0])
    >>> x, state = heavy_ball_step(x, 2 * x, heavy_ball_init(x), lr=0.1, beta=0.9)
    >>> state.step, state.d[0].tolist()
    (1, [2.0, -4.0])
    """

    step: int
    d: tuple[Array, ...]


def _couple(xp, gs, xs, weight_decay):
    if weight_decay == 0:
        return gs
    return tuple(g + weight_decay * x for g, x in zip(gs, xs, strict=True))


def gd_step(params: Any, grads: Any, *, lr: float, weight_decay: float = 0.0) -> Any:
    r"""One gradient step :math:`x \leftarrow x - \eta (g + \mu x)`.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import gd_step
    >>> gd_step(np.array([1.0]), np.array([2.0]), lr=0.1)
    array([0.8])
    """
    xs, single = as_tuple(params)
    gs, _ = as_tuple(grads)
    xp = array_namespace(*xs, *gs)
    gs = _couple(xp, gs, xs, weight_decay)
    return restore(tuple(x - lr * g for x, g in zip(xs, gs, strict=True)), single)


def heavy_ball_init(params: Any) -> HeavyBallState:
    """Initial state: zero buffers and ``step = 0`` (step 0 sets ``d = g``).

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import heavy_ball_init
    >>> state = heavy_ball_init((np.ones(2), np.ones((2, 3))))
    >>> state.step, [d.shape for d in state.d]
    (0, [(2,), (2, 3)])
    """
    xs, _ = as_tuple(params)
    xp = array_namespace(*xs)
    return HeavyBallState(step=0, d=tuple(xp.zeros_like(x) for x in xs))


def heavy_ball_step(
    params: Any,
    grads: Any,
    state: HeavyBallState,
    *,
    lr: float,
    beta: float,
    weight_decay: float = 0.0,
) -> tuple[Any, HeavyBallState]:
    r"""Damped heavy ball (MGD) with a fixed momentum ``beta``.

    .. math::

        d_0 = g_0, \quad d_{t+1} = \beta d_t + (1-\beta) g_t, \quad
        x_{t+1} = x_t - \eta\, d_{t+1}

    This is ``torch.optim.SGD(momentum=beta, dampening=beta)`` except that torch
    skips the dampening on its first step. The new state owns its arrays: it never
    holds the caller's gradient arrays.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import heavy_ball_init, heavy_ball_step
    >>> x, g = np.array([1.0]), np.array([1.0])
    >>> x, s = heavy_ball_step(x, g, heavy_ball_init(x), lr=0.5, beta=0.9)
    >>> x
    array([0.5])
    """
    xs, single, gs, ds = _momentum(
        params, grads, state, weight_decay, lambda d, g: beta * d + (1.0 - beta) * g
    )
    new_x = tuple(x - lr * d for x, d in zip(xs, ds, strict=True))
    return restore(new_x, single), HeavyBallState(step=state.step + 1, d=ds)


def _momentum(
    params: Any,
    grads: Any,
    state: HeavyBallState,
    weight_decay: float,
    update: Callable[[Array, Array], Array],
) -> tuple[tuple[Array, ...], bool, tuple[Array, ...], tuple[Array, ...]]:
    """The arrays, whether one was given, the gradients with the L2 term, and the new
    buffers of a heavy-ball step: ``d = g`` (a copy) on step 0, else ``update(d, g)``."""
    xs, single = as_tuple(params)
    gs, _ = as_tuple(grads)
    xp = array_namespace(*xs, *gs)
    gs = _couple(xp, gs, xs, weight_decay)
    if state.step == 0:
        ds = tuple(_copy(xp, g) for g in gs)
    else:
        ds = tuple(update(d, g) for d, g in zip(state.d, gs, strict=True))
    return xs, single, gs, ds


# --------------------------------------------------------------------------- AM-MGD / AM-MSGD


def classical_momentum_step(
    params: Any,
    grads: Any,
    state: HeavyBallState,
    *,
    lr: float,
    beta: float,
    nesterov: bool = False,
    weight_decay: float = 0.0,
) -> tuple[Any, HeavyBallState]:
    r"""Classical (undamped) momentum: Polyak's heavy ball, or Nesterov's momentum.

    .. math::

        d_0 = 0, \quad d_{t+1} = \beta d_t + g_t, \quad
        x_{t+1} = x_t - \eta\, d_{t+1} \ \text{(heavy ball)}, \quad
        x_{t+1} = x_t - \eta\, (g_t + \beta d_{t+1}) \ \text{(Nesterov)}

    The heavy ball is :math:`x_{t+1} = x_t - \eta g_t + \beta (x_t - x_{t-1})`;
    both are ``torch.optim.SGD(momentum=beta, nesterov=...)`` (dampening 0), whose
    buffer starts at :math:`g_0`, as :math:`d_1` here. Unlike the damped
    :func:`heavy_ball_step`, the momentum adds up to :math:`1/(1-\beta)` gradients:
    on an :math:`L`-smooth :math:`\mu`-strongly convex quadratic the textbook tuning
    :math:`\eta = 4/(\sqrt L + \sqrt\mu)^2`,
    :math:`\beta = ((\sqrt\kappa - 1)/(\sqrt\kappa + 1))^2` converges at the rate
    :math:`(\sqrt\kappa - 1)/(\sqrt\kappa + 1)` per step.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt.optimize.steps import classical_momentum_step, heavy_ball_init
    >>> x, g = np.array([1.0]), np.array([1.0])
    >>> x, s = classical_momentum_step(x, g, heavy_ball_init(x), lr=0.5, beta=0.9)
    >>> x, s.d
    (array([0.5]), (array([1.]),))
    >>> x, s = classical_momentum_step(x, g, s, lr=0.5, beta=0.9)
    >>> x
    array([-0.45])
    """
    xs, single, gs, ds = _momentum(params, grads, state, weight_decay, lambda d, g: beta * d + g)
    if nesterov:
        new_x = tuple(x - lr * (g + beta * d) for x, g, d in zip(xs, gs, ds, strict=True))
    else:
        new_x = tuple(x - lr * d for x, d in zip(xs, ds, strict=True))
    return restore(new_x, single), HeavyBallState(step=state.step + 1, d=ds)


class AMState(NamedTuple):
    r"""State of AM-MGD / AM-MSGD; the same structure at every step.

    Attributes
    ----------
    step : int
        Steps taken so far.
    d : tuple of arrays
        Momentum buffer (zeros before step 0 unless given).
    f_prev : float
        :math:`f(x_{t-1})` for the exact numerator; NaN until an f value is known.
    d_from_g : bool
        Whether step 0 sets ``d = g`` (the default) instead of using ``d`` as given.
    lr_prev : float
        The learning rate of the previous step, for the linearised numerator's
        :math:`r = \eta_{t-1}/\eta_t` under a schedule; NaN before the first step.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import AMState
    >>> state = AMState(step=0, d=(np.zeros(2),))
    >>> state.d_from_g, state.f_prev
    (True, nan)
    >>> state._replace(step=1).step
    1
    """

    step: int
    d: tuple[Array, ...]
    f_prev: Any = math.nan
    d_from_g: bool = True
    lr_prev: float = math.nan


def am_momentum_init(params: Any, d0: Any = None) -> AMState:
    """Initial AM state.

    ``d0`` (e.g. zeros, as in the theory of Section 3.5) replaces ``d_0 = g_0``.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import am_momentum_init
    >>> x = np.array([1.0, -2.0])
    >>> state = am_momentum_init(x)
    >>> state.step, state.d[0].tolist(), state.d_from_g
    (0, [0.0, 0.0], True)
    >>> am_momentum_init(x, d0=np.array([0.5, 0.5])).d_from_g
    False
    """
    xs, _ = as_tuple(params)
    xp = array_namespace(*xs)
    if d0 is None:
        return AMState(0, tuple(xp.zeros_like(x) for x in xs), math.nan, True)
    ds, _ = as_tuple(d0)
    return AMState(0, tuple(ds), math.nan, False)


def _lr_ratio(state: Any, lr: float) -> float:
    """``r = lr_{t-1} / lr_t`` of a state's next step (1 before its first step)."""
    prev = state.lr_prev
    return _rule.lr_ratio(None if prev != prev else prev, lr)


def _f_decrease(numerator: str, f: Any, f_prev: Any) -> Any:
    """``f_prev - f`` for the exact numerator once both are known, else None (linear)."""
    if numerator != "exact" or f is None:
        return None
    if isinstance(f_prev, float) and math.isnan(f_prev):
        return None
    return f_prev - f


@rule_keywords()
def am_momentum_step(
    params: Any,
    grads: Any,
    state: AMState,
    *,
    lr: float,
    f: Any = None,
    weight_decay: float = 0.0,
    config: AMConfig | None = None,
    **rule: Any,
) -> tuple[Any, AMState, Any]:
    r"""One step of AM-MGD (exact numerator) or AM-MSGD (linearised numerator).

    .. math::

        \beta_t &= \operatorname{clip}\Big(\tfrac{\text{num}_t}{\|d_t - g_t\|^2},
                    0, \beta_{\max}\Big) \\
        d_{t+1} &= g_t + \tfrac{\beta_t + \lambda}{1 + \lambda}(d_t - g_t) \\
        x_{t+1} &= x_t - \eta\, d_{t+1}

    with num as in :func:`am_beta`; ``d_0 = g_0`` unless the state was created
    with ``d0``. Weight decay is coupled (``g <- g + weight_decay * x``).

    Parameters
    ----------
    params, grads : array or sequence of arrays
        :math:`x_t` and :math:`g_t = \nabla f(x_t)` (or a mini-batch gradient).
    state : AMState
        From :func:`am_momentum_init` or the previous step.
    lr, lam, beta_max : float
        :math:`\eta`, :math:`\lambda`, :math:`\beta_{\max}`.
    numerator : {"exact", "linear"}
        ``"exact"`` needs ``f`` (:math:`f(x_t)`); the first step, with no
        :math:`f(x_{t-1})` yet, uses the linearised numerator.
    f : scalar, optional
        :math:`f(x_t)`; stored for the next exact numerator.
    weight_decay : float
        Coupled L2 weight decay :math:`\mu`.
    per_layer : bool
        One beta per array instead of one over all arrays. With the exact
        numerator the one decrease :math:`f(x_{t-1}) - f(x_t)` enters every
        scope's numerator, as algorithms.md writes it.
    variant, beta_min, theta, beta_high, beta_low
        See :func:`apply_variant`.
    config : AMConfig, optional
        The rule's configuration, built once by the caller; it replaces ``lam``,
        ``beta_max``, ``numerator``, ``per_layer`` and the variant arguments.

    Returns
    -------
    params : same structure as ``params``
        :math:`x_{t+1}`.
    state : AMState
    beta : 0-d array, or tuple of 0-d arrays when ``per_layer``

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import am_momentum_init, am_momentum_step
    >>> x = np.array([3.0, 1.0])
    >>> state = am_momentum_init(x)
    >>> for _ in range(3):
    ...     f, g = 0.5 * float(x @ x), x.copy()
    ...     x, state, beta = am_momentum_step(x, g, state, lr=0.5, f=f)
    >>> float(beta), x.tolist()
    (0.25, [-0.375, -0.125])
    """
    config = config_of_call(am_momentum_step, config, rule)
    xs, single = as_tuple(params)
    gs, _ = as_tuple(grads)
    f_decrease = _f_decrease(config.numerator, f, state.f_prev)
    first = state.step == 0 and state.d_from_g
    f_next = math.nan if f is None else f
    # under a schedule the linearised numerator takes r = lr_{t-1} / lr_t
    lr_ratio = _lr_ratio(state, lr) if f_decrease is None else 1.0
    lr_used = float(lr)

    # a library's fast path (plain NumPy arrays: the same reduce -> rule -> apply with
    # fewer passes over memory and no array-API dispatch, amopt.backends.numpy); no caller
    # array is modified there either
    fast = backends.kernel(backends.library_of(xs[0]), "momentum_step")
    out = fast and fast(
        xs,
        gs,
        state.d,
        config,
        lr=lr,
        weight_decay=weight_decay,
        first=first,
        f_decrease=f_decrease,
        lr_ratio=lr_ratio,
    )
    if out:
        new_x, new_ds, betas = out
        new_state = AMState(state.step + 1, new_ds, f_next, state.d_from_g, lr_used)
        return restore(new_x, single), new_state, (tuple(betas) if config.per_layer else betas[0])

    xp = array_namespace(*xs, *gs)
    gs = _couple(xp, gs, xs, weight_decay)
    ds = gs if first else state.d
    scope_list = scopes(len(xs), config.per_layer)
    sums = momentum_sums(xp, gs, ds, scope_list, exact=f_decrease is not None)
    new_d: list[Array] = list(ds)
    betas = []
    for k, scope in enumerate(scope_list):
        beta, gamma = _rule.momentum_beta(
            plain_namespace(xp),
            row(sums, k),
            config,
            lr=lr,
            f_decrease=f_decrease,
            lr_ratio=lr_ratio,
        )
        for i in scope:
            coef = cast(xp, gamma, gs[i].dtype)
            # d = g + coef*(d - g) rather than the convex-combination form: exact when d = g.
            new_d[i] = gs[i] + coef * (ds[i] - gs[i])
        betas.append(beta)
    new_x = tuple(x - lr * d for x, d in zip(xs, new_d, strict=True))
    new_state = AMState(state.step + 1, tuple(new_d), f_next, state.d_from_g, lr_used)
    return restore(new_x, single), new_state, (tuple(betas) if config.per_layer else betas[0])


# --------------------------------------------------------------------------- Adam / AdamW


class AdamState(NamedTuple):
    """State of Adam / AdamW: ``step`` and the per-array ``exp_avg``, ``exp_avg_sq``.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import adam_init, adam_step
    >>> x = np.array([1.0, -1.0])
    >>> x, state = adam_step(x, 2 * x, adam_init(x), lr=0.1)
    >>> state.step, np.round(state.exp_avg[0], 6).tolist()
    (1, [0.2, -0.2])
    >>> np.round(state.exp_avg_sq[0], 6).tolist()
    [0.004, 0.004]
    """

    step: int
    exp_avg: tuple[Array, ...]
    exp_avg_sq: tuple[Array, ...]


def adam_init(params: Any) -> AdamState:
    """Zero moment estimates, as ``torch.optim.Adam``.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import adam_init
    >>> state = adam_init(np.array([1.0, -1.0]))
    >>> state.step, state.exp_avg[0].tolist(), state.exp_avg_sq[0].tolist()
    (0, [0.0, 0.0], [0.0, 0.0])
    """
    xs, _ = as_tuple(params)
    xp = array_namespace(*xs)
    zeros = tuple(xp.zeros_like(x) for x in xs)
    return AdamState(step=0, exp_avg=zeros, exp_avg_sq=zeros)


def _widen(xp: Any, arrays: tuple[Array, ...], like: tuple[Array, ...]) -> tuple[Array, ...]:
    """``arrays`` in the accumulation dtype of each array of ``like`` (half -> float32)."""
    return tuple(cast(xp, a, compute_dtype(xp, b)) for a, b in zip(arrays, like, strict=True))


def _narrow(xp: Any, arrays: tuple[Array, ...], like: tuple[Array, ...]) -> tuple[Array, ...]:
    return tuple(cast(xp, a, b.dtype) for a, b in zip(arrays, like, strict=True))


def adam_step(
    params: Any,
    grads: Any,
    state: AdamState,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    decoupled: bool = False,
) -> tuple[Any, AdamState]:
    r"""One step of Adam (``decoupled=False``, L2 weight decay) or AdamW, as ``torch.optim``.

    .. math::

        m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\quad
        v_t = \beta_2 v_{t-1} + (1-\beta_2) g_t^2,\quad
        x_t = x_{t-1} - \frac{\eta}{1-\beta_1^t}
              \frac{m_t}{\sqrt{v_t}/\sqrt{1-\beta_2^t} + \epsilon}

    Half-precision arrays are computed in float32 and stored back in their dtype, as
    torch does: :math:`g^2` and :math:`v / (1-\beta_2^t)` would overflow float16.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import adam_init, adam_step
    >>> x = np.array([1.0, -1.0])
    >>> x, state = adam_step(x, 2 * x, adam_init(x), lr=0.1)
    >>> np.round(x, 6).tolist()
    [0.9, -0.9]
    """
    xs0, single = as_tuple(params)
    gs, _ = as_tuple(grads)
    xp = array_namespace(*xs0, *gs)
    xs, gs = _widen(xp, xs0, xs0), _widen(xp, gs, xs0)
    ms, vs = _widen(xp, state.exp_avg, xs0), _widen(xp, state.exp_avg_sq, xs0)
    beta1, beta2 = betas
    t = state.step + 1
    if decoupled:
        xs = tuple(x * (1.0 - lr * weight_decay) for x in xs)
    else:
        gs = _couple(xp, gs, xs, weight_decay)
    ms = tuple(beta1 * m + (1.0 - beta1) * g for m, g in zip(ms, gs, strict=True))
    vs = tuple(beta2 * v + (1.0 - beta2) * (g * g) for v, g in zip(vs, gs, strict=True))
    bias1 = 1.0 - beta1**t
    bias2_sqrt = (1.0 - beta2**t) ** 0.5
    step_size = lr / bias1
    new_x = tuple(
        x - step_size * (m / (xp.sqrt(v) / bias2_sqrt + eps))
        for x, m, v in zip(xs, ms, vs, strict=True)
    )
    new_state = AdamState(t, _narrow(xp, ms, xs0), _narrow(xp, vs, xs0))
    return restore(_narrow(xp, new_x, xs0), single), new_state


# --------------------------------------------------------------------------- AM-Adam / AM-AdamW


class AMAdamState(NamedTuple):
    r"""State of AM-Adam / AM-AdamW; the same structure at every step.

    Attributes
    ----------
    step : int
    exp_avg, exp_avg_sq : tuple of arrays
        :math:`d` and :math:`v` per array (start at 0).
    beta1_prod : tuple of 0-d arrays
        Per array, the running product of the betas applied to its scope (starts at
        1, in the accumulation dtype); the arrays of a global scope hold equal values.
    f_prev : float
        Previous objective value, for the exact numerator; NaN until known.
    lr_prev : float
        The learning rate of the previous step, for the linearised numerator's
        :math:`r = \eta_{t-1}/\eta_t` under a schedule; NaN before the first step.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import am_adam_init
    >>> state = am_adam_init((np.ones(2), np.ones(3)))
    >>> state.step, [float(p) for p in state.beta1_prod]
    (0, [1.0, 1.0])
    >>> state.f_prev
    nan
    """

    step: int
    exp_avg: tuple[Array, ...]
    exp_avg_sq: tuple[Array, ...]
    beta1_prod: tuple[Array, ...]
    f_prev: Any = math.nan
    lr_prev: float = math.nan


def am_adam_init(params: Any) -> AMAdamState:
    """Zero moment estimates and products of one.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import am_adam_init
    >>> state = am_adam_init(np.array([1.0, -1.0]))
    >>> state.exp_avg[0].tolist(), state.exp_avg_sq[0].tolist()
    ([0.0, 0.0], [0.0, 0.0])
    >>> float(state.beta1_prod[0])
    1.0
    """
    xs, _ = as_tuple(params)
    xp = array_namespace(*xs)
    base = adam_init(params)
    prods = tuple(xp.ones((), dtype=accumulation_dtype(xp, [x])) for x in xs)
    return AMAdamState(0, base.exp_avg, base.exp_avg_sq, prods, math.nan)


def am_adam_beta(
    g: Any,
    d: Any,
    x: Any,
    p: Any,
    *,
    lr: float,
    lam: float = 0.1,
    beta_max: float = 0.9,
    weight_decay: float = 0.0,
    f_decrease: Any = None,
) -> Array:
    r"""AM-Adam(W) momentum coefficient over one scope (algorithms.md section 3, steps 4-5).

    With :math:`u = 1/(1+\lambda p)` and :math:`w = u/p` (elementwise),

    .. math::

        N &= \textstyle\sum \tfrac{g^2}{p} - \lambda u (d-g)^2 + \mu\eta \tfrac{g d}{p}
             + \mu(2+\mu\eta) g x - \mu d x, \qquad
        D = \textstyle\sum w (d-g)^2, \\
        \beta &= \operatorname{clip}(N/D, 0, \beta_{\max}),

    or, with ``f_decrease`` (:math:`f_{prev} - f`), the exact
    :math:`N = (1+\mu\eta)(f_{prev}-f)/\eta - \sum w (d-g)(g+\lambda p d) - \mu \sum x(d-g)`.
    ``beta = 0`` when :math:`D \le \epsilon^2 (\sum w d^2 + \sum w g^2)`. This is
    :func:`amopt.core.reduce.adam_sums` followed by the one rule,
    :func:`amopt.core.rule.adam_beta`.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import am_adam_beta
    >>> g = np.array([1.0, 2.0]); p = np.array([1.0, 1.0])
    >>> float(am_adam_beta(g, 0 * g, 0 * g, p, lr=1e-3, lam=0.0, beta_max=0.9))
    0.9
    """
    gs, _ = as_tuple(g)
    ds, _ = as_tuple(d)
    xs, _ = as_tuple(x)
    ps, _ = as_tuple(p)
    xp = array_namespace(*gs, *ds, *xs, *ps)
    cfg = _Bounds(float(lam), float(beta_max))
    exact = f_decrease is not None
    weights = _rule.adam_weights(cfg, lr=lr, weight_decay=weight_decay, exact=exact)
    sums = adam_sums(
        xp, gs, ds, xs, ps, [tuple(range(len(gs)))], lam=cfg.lam, weights=weights, exact=exact
    )
    return _rule.adam_beta(
        xp, row(sums, 0), cfg, lr=lr, weight_decay=weight_decay, f_decrease=f_decrease
    )


def _adam_x(x: Array, d: Array, p: Array, lr: float, wd: float, mode: str) -> Array:
    """AM-Adam's step 7: ``x`` moved by ``lr d / p`` with decoupled or proximal decay."""
    if mode == "proximal":
        return (x - lr * d / p) / (1.0 + lr * wd)
    return (1.0 - lr * wd) * x - lr * d / p


@rule_keywords(omit=("beta_max",), lam=0.1, numerator="linear", per_layer=True)
def am_adam_step(
    params: Any,
    grads: Any,
    state: AMAdamState,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    weight_decay_mode: str = "decoupled",
    f: Any = None,
    config: AMConfig | None = None,
    **rule: Any,
) -> tuple[Any, AMAdamState, Any]:
    r"""One step of AM-AdamW (decoupled or proximal weight decay); AM-Adam with ``weight_decay=0``.

    .. math::

        v &= \beta_2 v + (1-\beta_2) g^2, \quad \hat v = v / (1-\beta_2^t), \quad
        p = (1 - \beta_{1,\max} \textstyle\prod_{s<t}\beta_s)(\epsilon + \sqrt{\hat v}) \\
        \beta_t &= \text{am\_adam\_beta}(g, d, x, p), \quad
        d = g + \frac{\beta_t + \lambda p}{1 + \lambda p}(d - g) \\
        x &= (1 - \eta\mu) x - \eta\, d / p \quad\text{(decoupled)}, \qquad
        x = (x - \eta\, d/p) / (1 + \eta\mu) \quad\text{(proximal)}

    Half-precision arrays are computed in float32 and stored back in their dtype.

    Parameters
    ----------
    params, grads : array or sequence of arrays
    state : AMAdamState
    lr : float
    betas : (float, float)
        :math:`(\beta_{1,\max}, \beta_2)`.
    eps, weight_decay : float
    weight_decay_mode : {"decoupled", "proximal"}
    lam : float
    numerator : {"linear", "exact"}
        ``"exact"`` needs ``f``; step 1 always uses the linearised numerator.
    f : scalar, optional
    per_layer : bool
        One beta per array (default, the paper's LLM setting) or one over all.
    variant, beta_min, theta, beta_high, beta_low
        See :func:`apply_variant`.
    config : AMConfig, optional
        The rule's configuration built once by the caller (``beta_max`` is
        :math:`\beta_{1,\max}`); it replaces ``betas[0]``, ``lam``, ``numerator``,
        ``per_layer`` and the variant arguments.

    Returns
    -------
    params, state, beta
        ``beta`` is a 0-d array, or a tuple of them when ``per_layer``.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import am_adam_init, am_adam_step
    >>> x = np.array([1.0, -1.0])
    >>> x, state, beta = am_adam_step(x, 2 * x, am_adam_init(x), lr=0.1, per_layer=False)
    >>> float(beta)
    0.9
    """
    config = config_of_call(am_adam_step, config, rule, beta_max=betas[0])
    xs0, single = as_tuple(params)
    gs, _ = as_tuple(grads)
    xp = array_namespace(*xs0, *gs)
    xs, gs = _widen(xp, xs0, xs0), _widen(xp, gs, xs0)
    ds, vs = _widen(xp, state.exp_avg, xs0), _widen(xp, state.exp_avg_sq, xs0)
    beta2 = betas[1]
    t = state.step + 1
    wd = weight_decay
    lam = config.lam
    scope_list = scopes(len(xs), config.per_layer)
    f_decrease = _f_decrease(config.numerator, f, state.f_prev)
    exact = f_decrease is not None

    vs = tuple(beta2 * v + (1.0 - beta2) * (g * g) for v, g in zip(vs, gs, strict=True))
    bias2 = 1.0 - beta2**t
    ps: list[Array] = [None] * len(xs)  # type: ignore[list-item]
    prods = []
    for scope in scope_list:
        prod = state.beta1_prod[scope[0]]
        c = _rule.adam_correction(prod, config)
        for i in scope:
            ps[i] = cast(xp, c, vs[i].dtype) * (eps + xp.sqrt(vs[i] / bias2))
        prods.append(prod)
    ratio = 1.0 if exact else _lr_ratio(state, lr)  # r = lr_{t-1} / lr_t under a schedule
    weights = _rule.adam_weights(config, lr=lr, weight_decay=wd, exact=exact, lr_ratio=ratio)
    sums = adam_sums(xp, gs, ds, xs, ps, scope_list, lam=lam, weights=weights, exact=exact)
    new_d, new_x = list(ds), list(xs)
    new_prods: list[Array] = list(state.beta1_prod)
    betas_out = []
    for k, scope in enumerate(scope_list):
        rule_xp = plain_namespace(xp)
        beta = _rule.adam_beta(
            rule_xp,
            row(sums, k),
            config,
            lr=lr,
            weight_decay=wd,
            f_decrease=f_decrease,
            first=_first_step(state.step),
        )
        for i in scope:
            g, d, x, p = gs[i], ds[i], xs[i], ps[i]
            b = cast(xp, beta, g.dtype)
            d = g + (b + lam * p) / (1.0 + lam * p) * (d - g)
            new_d[i], new_x[i] = d, _adam_x(x, d, p, lr, wd, weight_decay_mode)
            new_prods[i] = prods[k] * beta
        betas_out.append(beta)
    f_next = math.nan if f is None else f
    new_state = AMAdamState(
        t,
        _narrow(xp, tuple(new_d), xs0),
        _narrow(xp, vs, xs0),
        tuple(new_prods),
        f_next,
        float(lr),
    )
    beta_ret = tuple(betas_out) if config.per_layer else betas_out[0]
    return restore(_narrow(xp, tuple(new_x), xs0), single), new_state, beta_ret


def _first_step(step: Any) -> Any:
    """Whether a state's next step is its first (``d = 0``): a Python bool where the
    counter is a number (the rule then takes no extra operation), else an array."""
    if isinstance(step, (int, np.integer)):
        return bool(step == 0)
    return step == 0
