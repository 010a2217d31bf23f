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

from collections.abc import Sequence
from typing import Any, NamedTuple

from amopt import _numpy_fast
from amopt.backends import accumulation_dtype, array_namespace, tiny

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
    "am_momentum_init",
    "am_momentum_step",
    "adam_init",
    "adam_step",
    "am_adam_init",
    "am_adam_step",
    "VARIANTS",
    "NUMERATORS",
    "WEIGHT_DECAY_MODES",
]

Array = Any
VARIANTS = (None, "clip", "restart")
NUMERATORS = ("exact", "linear")
WEIGHT_DECAY_MODES = ("decoupled", "proximal")


# --------------------------------------------------------------------------- helpers


def _as_tuple(params: Any) -> tuple[tuple[Array, ...], bool]:
    """Return ``(arrays, was_single)``."""
    if isinstance(params, list | tuple):
        return tuple(params), False
    return (params,), True


def _restore(arrays: tuple[Array, ...], single: bool) -> Any:
    return arrays[0] if single else arrays


def _scopes(n: int, per_layer: bool) -> list[tuple[int, ...]]:
    """Index groups forming the beta scopes."""
    return [(i,) for i in range(n)] if per_layer else [tuple(range(n))]


def _acc(xp: Any, arrays: Sequence[Array]) -> Any:
    """Accumulation dtype of a scope: float64 if any array is float64, else float32."""
    if any(a.dtype == xp.float64 for a in arrays):
        return xp.float64
    return accumulation_dtype(xp, arrays[0].dtype)


def _dot(xp: Any, a: Array, b: Array, acc: Any) -> Array:
    """``sum(a * b)`` over all coordinates, accumulated in ``acc``."""
    if a.dtype != acc:
        a = xp.astype(a, acc)
    if b.dtype != acc:
        b = xp.astype(b, acc)
    return xp.sum(xp.reshape(a, (-1,)) * xp.reshape(b, (-1,)))


def _scope_sum(xp: Any, pairs: Sequence[tuple[Array, Array]], acc: Any) -> Array:
    total = _dot(xp, *pairs[0], acc)
    for a, b in pairs[1:]:
        total = total + _dot(xp, a, b, acc)
    return total


def _guarded_ratio(xp: Any, num: Array, den: Array, ref: Array, beta_max: float, acc: Any):
    """``clip(num / den, 0, beta_max)``, and 0 when ``den <= tiny * ref`` or the ratio is NaN.

    The NaN case only arises when the reductions overflow (``inf / inf``); the
    momentum is then reset rather than letting a NaN out of the rule.
    """
    degenerate = den <= tiny(xp, acc) * ref
    safe_den = xp.where(degenerate, xp.ones_like(den), den)
    ratio = num / safe_den
    ratio = xp.where(xp.isnan(ratio), xp.zeros_like(ratio), ratio)
    beta = xp.clip(ratio, 0.0, float(beta_max))
    return xp.where(degenerate, xp.zeros_like(beta), beta)


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
    ``d = g = 0``); a NaN never comes out.

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
        In the accumulation dtype (float64 for float64 inputs, else float32).

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import am_beta
    >>> g, d = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    >>> float(am_beta(g, d))  # <g,g> / ||d-g||^2
    0.5
    """
    gs, _ = _as_tuple(g)
    ds, _ = _as_tuple(d)
    xp = array_namespace(*gs, *ds)
    return _am_beta(xp, gs, ds, lam, beta_max, lr, f_decrease)


def _am_beta(xp, gs, ds, lam, beta_max, lr, f_decrease):
    acc = _acc(xp, gs)
    # Half-precision inputs: form d - g in the accumulation dtype too, or it can overflow.
    gs = [g if g.dtype == acc else xp.astype(g, acc) for g in gs]
    ds = [d if d.dtype == acc else xp.astype(d, acc) for d in ds]
    vs = [dd - gg for dd, gg in zip(ds, gs, strict=True)]
    den = _scope_sum(xp, [(v, v) for v in vs], acc)
    gg = _scope_sum(xp, [(g, g) for g in gs], acc)
    dd = _scope_sum(xp, [(d, d) for d in ds], acc)
    if f_decrease is None:
        num = (1.0 + lam) * gg - lam * den
    else:
        vg = _scope_sum(xp, [(v, g) for v, g in zip(vs, gs, strict=True)], acc)
        vd = _scope_sum(xp, [(v, d) for v, d in zip(vs, ds, strict=True)], acc)
        num = f_decrease * (1.0 + lam) / lr - (vg + lam * vd)
        if num.dtype != acc:  # a float64 f_decrease must not promote a float32 scope
            num = xp.astype(num, acc)
    return _guarded_ratio(xp, num, den, dd + gg, beta_max, acc)


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
    ``None``: :math:`\beta_{AM}` unchanged.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import apply_variant
    >>> float(apply_variant(np.asarray(0.75), "restart"))
    0.9
    """
    return _apply_variant(
        array_namespace(beta), beta, variant, beta_min, theta, beta_high, beta_low
    )


def _apply_variant(xp, beta, variant, beta_min, theta, beta_high, beta_low):
    if variant is None:
        return beta
    if variant == "clip":
        return xp.clip(beta, float(beta_min), None)
    if variant == "restart":
        high = xp.full_like(beta, float(beta_high))
        low = xp.full_like(beta, float(beta_low))
        return xp.where(beta >= theta, high, low)
    raise ValueError(f"variant must be one of {VARIANTS}; got {variant!r}")


# --------------------------------------------------------------------------- GD / heavy ball


class HeavyBallState(NamedTuple):
    """State of the damped heavy ball: step count and momentum buffer ``d``."""

    step: int
    d: tuple[Array, ...] | None


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
    xs, single = _as_tuple(params)
    gs, _ = _as_tuple(grads)
    xp = array_namespace(*xs, *gs)
    gs = _couple(xp, gs, xs, weight_decay)
    return _restore(tuple(x - lr * g for x, g in zip(xs, gs, strict=True)), single)


def heavy_ball_init(params: Any) -> HeavyBallState:
    """Initial state: no buffer yet (step 0 sets ``d = g``)."""
    return HeavyBallState(step=0, d=None)


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
    skips the dampening on its first step.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import heavy_ball_init, heavy_ball_step
    >>> x, g = np.array([1.0]), np.array([1.0])
    >>> x, s = heavy_ball_step(x, g, heavy_ball_init(x), lr=0.5, beta=0.9)
    >>> x
    array([0.5])
    """
    xs, single = _as_tuple(params)
    gs, _ = _as_tuple(grads)
    xp = array_namespace(*xs, *gs)
    gs = _couple(xp, gs, xs, weight_decay)
    if state.d is None:
        ds = gs
    else:
        ds = tuple(beta * d + (1.0 - beta) * g for d, g in zip(state.d, gs, strict=True))
    new_x = tuple(x - lr * d for x, d in zip(xs, ds, strict=True))
    return _restore(new_x, single), HeavyBallState(step=state.step + 1, d=ds)


# --------------------------------------------------------------------------- AM-MGD / AM-MSGD


class AMState(NamedTuple):
    """State of AM-MGD / AM-MSGD.

    Attributes
    ----------
    step : int
        Steps taken so far.
    d : tuple of arrays or None
        Momentum buffer; ``None`` before step 0 (which then sets ``d = g``).
    f_prev : scalar or None
        :math:`f(x_{t-1})`, for the exact numerator.
    """

    step: int
    d: tuple[Array, ...] | None
    f_prev: Any


def am_momentum_init(params: Any, d0: Any = None) -> AMState:
    """Initial AM state.

    ``d0`` (e.g. zeros, as in the theory of Section 3.5) replaces ``d_0 = g_0``.
    """
    if d0 is None:
        return AMState(step=0, d=None, f_prev=None)
    ds, _ = _as_tuple(d0)
    return AMState(step=0, d=ds, f_prev=None)


def am_momentum_step(
    params: Any,
    grads: Any,
    state: AMState,
    *,
    lr: float,
    lam: float = 0.0,
    beta_max: float = 1.0,
    numerator: str = "exact",
    f: Any = None,
    weight_decay: float = 0.0,
    per_layer: bool = False,
    variant: str | None = None,
    beta_min: float = 0.5,
    theta: float = 0.7,
    beta_high: float = 0.9,
    beta_low: float = 0.1,
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
    xs, single = _as_tuple(params)
    gs, _ = _as_tuple(grads)
    f_decrease = None
    if numerator == "exact" and f is not None and state.f_prev is not None:
        f_decrease = state.f_prev - f

    if _numpy_fast.eligible(xs, gs, () if state.d is None else state.d):
        # Plain NumPy arrays: the same rule with fewer passes over memory and no array-API
        # dispatch (see amopt._numpy_fast); no caller array is modified there either.
        if weight_decay != 0:
            gs = tuple(g + weight_decay * x for g, x in zip(gs, xs, strict=True))
        ds = gs if state.d is None else state.d
        new_x, new_ds, betas = _numpy_fast.am_momentum_step_numpy(
            xs,
            gs,
            ds,
            per_layer,
            lr=lr,
            lam=lam,
            beta_max=beta_max,
            f_decrease=f_decrease,
            variant=variant,
            beta_min=beta_min,
            theta=theta,
            beta_high=beta_high,
            beta_low=beta_low,
        )
        new_state = AMState(step=state.step + 1, d=new_ds, f_prev=f)
        return _restore(new_x, single), new_state, (tuple(betas) if per_layer else betas[0])

    xp = array_namespace(*xs, *gs)
    gs = _couple(xp, gs, xs, weight_decay)
    ds = gs if state.d is None else state.d
    new_d: list[Array] = list(ds)
    betas = []
    for scope in _scopes(len(xs), per_layer):
        g_s = [gs[i] for i in scope]
        d_s = [ds[i] for i in scope]
        beta = _am_beta(xp, g_s, d_s, lam, beta_max, lr, f_decrease)
        beta = _apply_variant(xp, beta, variant, beta_min, theta, beta_high, beta_low)
        for i in scope:
            coef = xp.astype((beta + lam) / (1.0 + lam), gs[i].dtype)
            # d = g + coef*(d - g) rather than the convex-combination form: exact when d = g.
            new_d[i] = gs[i] + coef * (ds[i] - gs[i])
        betas.append(beta)
    new_x = tuple(x - lr * d for x, d in zip(xs, new_d, strict=True))
    new_state = AMState(step=state.step + 1, d=tuple(new_d), f_prev=f)
    return _restore(new_x, single), new_state, (tuple(betas) if per_layer else betas[0])


# --------------------------------------------------------------------------- Adam / AdamW


class AdamState(NamedTuple):
    """State of Adam / AdamW: ``step`` and the per-array ``exp_avg``, ``exp_avg_sq``."""

    step: int
    exp_avg: tuple[Array, ...]
    exp_avg_sq: tuple[Array, ...]


def adam_init(params: Any) -> AdamState:
    """Zero moment estimates, as ``torch.optim.Adam``."""
    xs, _ = _as_tuple(params)
    xp = array_namespace(*xs)
    zeros = tuple(xp.zeros_like(x) for x in xs)
    return AdamState(step=0, exp_avg=zeros, exp_avg_sq=zeros)


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

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import adam_init, adam_step
    >>> x = np.array([1.0, -1.0])
    >>> x, state = adam_step(x, 2 * x, adam_init(x), lr=0.1)
    >>> np.round(x, 6).tolist()
    [0.9, -0.9]
    """
    xs, single = _as_tuple(params)
    gs, _ = _as_tuple(grads)
    xp = array_namespace(*xs, *gs)
    beta1, beta2 = betas
    t = state.step + 1
    if decoupled:
        xs = tuple(x * (1.0 - lr * weight_decay) for x in xs)
    else:
        gs = _couple(xp, gs, xs, weight_decay)
    ms = tuple(beta1 * m + (1.0 - beta1) * g for m, g in zip(state.exp_avg, gs, strict=True))
    vs = tuple(
        beta2 * v + (1.0 - beta2) * (g * g) for v, g in zip(state.exp_avg_sq, gs, strict=True)
    )
    bias1 = 1.0 - beta1**t
    bias2_sqrt = (1.0 - beta2**t) ** 0.5
    step_size = lr / bias1
    new_x = tuple(
        x - step_size * (m / (xp.sqrt(v) / bias2_sqrt + eps))
        for x, m, v in zip(xs, ms, vs, strict=True)
    )
    return _restore(new_x, single), AdamState(step=t, exp_avg=ms, exp_avg_sq=vs)


# --------------------------------------------------------------------------- AM-Adam / AM-AdamW


class AMAdamState(NamedTuple):
    """State of AM-Adam / AM-AdamW.

    Attributes
    ----------
    step : int
    exp_avg, exp_avg_sq : tuple of arrays
        :math:`d` and :math:`v` per array (start at 0).
    beta1_prod : tuple of 0-d arrays or None
        Running product of the applied betas, one per beta scope (starts at 1).
    f_prev : scalar or None
        Previous objective value, for the exact numerator.
    """

    step: int
    exp_avg: tuple[Array, ...]
    exp_avg_sq: tuple[Array, ...]
    beta1_prod: tuple[Array, ...] | None
    f_prev: Any


def am_adam_init(params: Any) -> AMAdamState:
    """Zero moment estimates; ``beta1_prod`` is created (as ones) on the first step."""
    base = adam_init(params)
    return AMAdamState(0, base.exp_avg, base.exp_avg_sq, None, None)


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
    ``beta = 0`` when :math:`D \le \epsilon^2 (\sum w d^2 + \sum w g^2)`.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt import am_adam_beta
    >>> g = np.array([1.0, 2.0]); p = np.array([1.0, 1.0])
    >>> float(am_adam_beta(g, 0 * g, 0 * g, p, lr=1e-3, lam=0.0, beta_max=0.9))
    0.9
    """
    gs, _ = _as_tuple(g)
    ds, _ = _as_tuple(d)
    xs, _ = _as_tuple(x)
    ps, _ = _as_tuple(p)
    xp = array_namespace(*gs, *ds, *xs, *ps)
    return _am_adam_beta(xp, gs, ds, xs, ps, lr, lam, beta_max, weight_decay, f_decrease)


def _am_adam_beta(xp, gs, ds, xs, ps, lr, lam, beta_max, wd, f_decrease):
    acc = _acc(xp, gs)
    num = den = ref = None
    for g, d, x, p in zip(gs, ds, xs, ps, strict=True):
        g, d, x, p = (a if a.dtype == acc else xp.astype(a, acc) for a in (g, d, x, p))
        u = 1.0 / (1.0 + lam * p)
        w = u / p
        v = d - g
        if f_decrease is None:
            terms = g * g / p - lam * u * v * v
            if wd != 0:
                terms = terms + wd * lr * g * d / p + wd * (2.0 + wd * lr) * g * x - wd * d * x
        else:
            terms = -w * v * (g + lam * p * d)
            if wd != 0:
                terms = terms - wd * x * v
        n_k = xp.sum(terms)
        d_k = xp.sum(w * v * v)
        r_k = xp.sum(w * d * d) + xp.sum(w * g * g)
        num = n_k if num is None else num + n_k
        den = d_k if den is None else den + d_k
        ref = r_k if ref is None else ref + r_k
    if f_decrease is not None:
        num = num + (1.0 + wd * lr) * f_decrease / lr
        if num.dtype != acc:
            num = xp.astype(num, acc)
    return _guarded_ratio(xp, num, den, ref, beta_max, acc)


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
    lam: float = 0.1,
    numerator: str = "linear",
    f: Any = None,
    per_layer: bool = True,
    variant: str | None = None,
    beta_min: float = 0.5,
    theta: float = 0.7,
    beta_high: float = 0.9,
    beta_low: float = 0.1,
) -> tuple[Any, AMAdamState, Any]:
    r"""One step of AM-AdamW (decoupled or proximal weight decay); AM-Adam with ``weight_decay=0``.

    .. math::

        v &= \beta_2 v + (1-\beta_2) g^2, \quad \hat v = v / (1-\beta_2^t), \quad
        p = (1 - \beta_{1,\max} \textstyle\prod_{s<t}\beta_s)(\epsilon + \sqrt{\hat v}) \\
        \beta_t &= \text{am\_adam\_beta}(g, d, x, p), \quad
        d = g + \frac{\beta_t + \lambda p}{1 + \lambda p}(d - g) \\
        x &= (1 - \eta\mu) x - \eta\, d / p \quad\text{(decoupled)}, \qquad
        x = (x - \eta\, d/p) / (1 + \eta\mu) \quad\text{(proximal)}

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
    xs, single = _as_tuple(params)
    gs, _ = _as_tuple(grads)
    xp = array_namespace(*xs, *gs)
    beta1_max, beta2 = betas
    t = state.step + 1
    wd = weight_decay
    scopes = _scopes(len(xs), per_layer)
    prods = state.beta1_prod
    if prods is None:
        prods = tuple(xp.ones((), dtype=_acc(xp, [gs[i] for i in s])) for s in scopes)
    f_decrease = None
    if numerator == "exact" and f is not None and state.f_prev is not None:
        f_decrease = state.f_prev - f

    vs = tuple(
        beta2 * v + (1.0 - beta2) * (g * g) for v, g in zip(state.exp_avg_sq, gs, strict=True)
    )
    bias2 = 1.0 - beta2**t
    new_d = list(state.exp_avg)
    new_x = list(xs)
    new_prods = []
    betas_out = []
    for scope, prod in zip(scopes, prods, strict=True):
        c = 1.0 - beta1_max * prod
        p_s = [xp.astype(c, vs[i].dtype) * (eps + xp.sqrt(vs[i] / bias2)) for i in scope]
        beta = _am_adam_beta(
            xp,
            [gs[i] for i in scope],
            [state.exp_avg[i] for i in scope],
            [xs[i] for i in scope],
            p_s,
            lr,
            lam,
            beta1_max,
            wd,
            f_decrease,
        )
        beta = _apply_variant(xp, beta, variant, beta_min, theta, beta_high, beta_low)
        for i, p in zip(scope, p_s, strict=True):
            g, d, x = gs[i], state.exp_avg[i], xs[i]
            b = xp.astype(beta, g.dtype)
            d = g + (b + lam * p) / (1.0 + lam * p) * (d - g)
            if weight_decay_mode == "proximal":
                x = (x - lr * d / p) / (1.0 + lr * wd)
            else:
                x = (1.0 - lr * wd) * x - lr * d / p
            new_d[i], new_x[i] = d, x
        new_prods.append(prod * beta)
        betas_out.append(beta)
    new_state = AMAdamState(t, tuple(new_d), vs, tuple(new_prods), f)
    beta_ret = tuple(betas_out) if per_layer else betas_out[0]
    return _restore(tuple(new_x), single), new_state, beta_ret
