r"""The Adaptive Memory rules, once: per-scope sums -> beta.

Every AM method is three stages (``docs/architecture.md``):

1. **reduce**: a kernel forms, for each beta scope, the few sums the rule needs
   (:mod:`amopt.core.reduce` for the array-API core; NumPy, torch, C and Triton
   kernels elsewhere), stacked in one small array, accumulated in at least float32;
2. **rule** (this module): pure functions of those sums and a frozen
   configuration that return beta (and the coefficient of the momentum update);
3. **apply**: a kernel updates the momentum and the parameters.

The functions here are branch-free on array values (no ``if`` on an array, no
conversion to a Python number): they run on NumPy, CuPy, torch (inside
``torch.compile`` and on the device) and array-api-strict alike. ``xp`` is the
array namespace of ``sums``: a compat namespace, ``array_api_strict``, the plain
``torch`` module or ``numpy`` itself (the device loop's rule on host floats).
Configuration values (``cfg``) are Python numbers.

Sums of one scope sit in the last axis of ``sums``, in the order of
:data:`MOMENTUM_SUMS` or :data:`ADAM_SUMS`; leading axes index scopes, so one
call evaluates every scope of a step. Between reduce and rule the sums of a
sharded scope are added across the ranks that hold its pieces (the sums are
additive by construction).
"""

from __future__ import annotations

from typing import Any

from amopt.core.reduce import cast

__all__ = [
    "ADAM_SUMS",
    "ADAM_TERMS",
    "ADAM_EXACT_TERMS",
    "MOMENTUM_SUMS",
    "NUMERATORS",
    "VARIANTS",
    "WEIGHT_DECAY_MODES",
    "adam_beta",
    "adam_correction",
    "adam_weights",
    "apply_variant",
    "guarded_ratio",
    "lr_ratio",
    "momentum_beta",
    "momentum_beta_of_dots",
]

Array = Any

VARIANTS = (None, "clip", "restart")
NUMERATORS = ("exact", "linear")
#: How weight decay enters an AM-Adam(W) step, the one list of them: ``"decoupled"``
#: (AdamW's) and ``"proximal"`` everywhere; ``"l2"`` (AM-Adam, the torch optimizers only):
#: the decay is an L2 gradient term and the rule sees ``wd = 0``. The array steps
#: (``minimize``'s ``am-adamw``, :func:`amopt.am_adam_step`) take the first two.
WEIGHT_DECAY_MODES = ("decoupled", "proximal", "l2")

#: AM-MGD / AM-MSGD sums of a scope, with ``v = d - g``: ``<v,v>, <g,g>, <d,d>, <v,g>,
#: <v,d>``. The last two are needed by the exact numerator only.
MOMENTUM_SUMS = ("vv", "gg", "dd", "vg", "vd")
#: AM-Adam(W) sums of a scope: the weighted numerator ``sum_k a_k sum(term_k)`` (weights
#: from :func:`adam_weights`), ``D = sum(w (d-g)^2)`` and ``ref = sum(w d^2) + sum(w g^2)``.
ADAM_SUMS = ("num", "den", "ref")
#: Elementwise terms of the linearised AM-Adam numerator, ``u = 1/(1+lam p)``, ``w = u/p``.
ADAM_TERMS = ("g*g/p", "u*(d-g)^2", "g*d/p", "g*x", "d*x")
#: Elementwise terms of the exact AM-Adam numerator (the f values enter in the rule).
ADAM_EXACT_TERMS = ("w*(d-g)*g", "u*(d-g)*d", "x*(d-g)")


def guarded_ratio(
    xp: Any, num: Array, den: Array, ref: Array, beta_max: float, degenerate: Any = 0.0
) -> Array:
    r"""``clip(num / den, 0, beta_max)``; ``degenerate`` where ``den <= tiny * ref``, 0
    where the ratio is NaN.

    ``tiny = eps(dtype)^2`` of the sums' dtype (algorithms.md, section 2 step 4). A NaN
    only arises from overflowing sums (``inf / inf``); the momentum is then reset
    rather than letting a NaN out of the rule. ``degenerate`` is the value of a
    vanishing denominator: 0, except on AM-Adam's first step (:func:`adam_beta`).
    """
    tiny = float(xp.finfo(den.dtype).eps) ** 2
    vanishing = den <= tiny * ref
    ratio = num / xp.where(vanishing, 1.0, den)
    # eight elementwise operations (on a device each is a launch), all of them in the
    # recorded rules' set (amopt.core.tape)
    beta = xp.where(xp.isnan(ratio), 0.0, xp.clip(ratio, 0.0, float(beta_max)))
    return xp.where(vanishing, degenerate, beta)


def apply_variant(xp: Any, beta: Array, cfg: Any) -> Array:
    r"""The variants of the paper's "what matters when adapting beta" (algorithms.md, 4).

    ``"clip"``: :math:`\max(\beta, \beta_{\min})`; ``"restart"``: :math:`\beta_{high}`
    if :math:`\beta \ge \theta` else :math:`\beta_{low}`; ``None``: unchanged. ``cfg``
    has the attributes ``variant``, ``beta_min``, ``theta``, ``beta_high``, ``beta_low``.
    """
    variant = cfg.variant
    if variant is None:
        return beta
    if variant == "clip":
        return xp.clip(beta, float(cfg.beta_min), None)
    if variant == "restart":
        high = xp.full_like(beta, float(cfg.beta_high))
        low = xp.full_like(beta, float(cfg.beta_low))
        return xp.where(beta >= cfg.theta, high, low)
    raise ValueError(f"variant must be one of {VARIANTS}; got variant={variant!r}")


def momentum_beta(
    xp: Any,
    sums: Array,
    cfg: Any,
    *,
    lr: float | None = None,
    f_decrease: Any = None,
    lr_ratio: Any = None,
) -> tuple[Array, Array]:
    r"""AM-MGD / AM-MSGD: ``(beta, gamma)`` of each scope from its sums.

    With :math:`v = d - g`, the sums :data:`MOMENTUM_SUMS` and
    :math:`r = \eta_{t-1} / \eta_t` (``lr_ratio``),

    .. math::

        \text{num} = \begin{cases}
            (f_{prev} - f)(1+\lambda)/\eta - (\langle v,g\rangle + \lambda\langle v,d\rangle)
                & \text{exact (``f_decrease`` given)} \\
            (1+\lambda) r \langle g,d\rangle - \langle v, g + \lambda d\rangle
                & \text{linearised}
        \end{cases} \\
        \beta = \operatorname{clip}(\text{num} / \langle v,v\rangle, 0, \beta_{\max}),
        \qquad \gamma = \frac{\beta + \lambda}{1 + \lambda},

    with :math:`\beta = 0` when :math:`\langle v,v\rangle \le \epsilon^2(\langle d,d\rangle
    + \langle g,g\rangle)`, then the variant of ``cfg``. The update is
    :math:`d \leftarrow g + \gamma (d - g)`.

    Parameters
    ----------
    xp : namespace
    sums : array, shape (..., 3) or (..., 5)
        :data:`MOMENTUM_SUMS` of each scope (``vg``, ``vd`` only with ``f_decrease``).
    cfg : AMConfig
        ``lam``, ``beta_max`` and the variant.
    lr : float, optional
        :math:`\eta`, with ``f_decrease``.
    f_decrease : scalar, optional
        :math:`f(x_{t-1}) - f(x_t)`: the exact numerator.
    lr_ratio : scalar or array, optional
        :math:`r = \eta_{t-1}/\eta_t` of the linearised numerator (algorithms.md,
        section 2 step 3): it estimates :math:`f(x_{t-1}) - f(x_t)` by
        :math:`\eta_{t-1}\langle g, d\rangle`, the step that moved :math:`x` to
        :math:`x_t`. ``None`` or the number 1 (a constant learning rate): the
        constant-lr form :math:`(1+\lambda)\langle g,g\rangle - \lambda\langle
        v,v\rangle`, which it equals at :math:`r = 1`; otherwise that form plus
        :math:`(r - 1)(1+\lambda)\langle g,d\rangle`, with :math:`\langle g,d\rangle
        = (\langle d,d\rangle + \langle g,g\rangle - \langle v,v\rangle)/2` from the
        sums every reduce forms (an array ``r`` equal to 1 adds an exact 0).

    Returns
    -------
    beta, gamma : arrays of shape ``sums.shape[:-1]``, in the dtype of ``sums``
    """
    lam = float(cfg.lam)
    vv, gg, dd = sums[..., 0], sums[..., 1], sums[..., 2]
    if f_decrease is None:
        num = (1.0 + lam) * gg - lam * vv
        if not _is_one(lr_ratio):
            # <g, d> by polarisation of the three sums of squares: no new reduction
            num = num + (lr_ratio - 1.0) * (1.0 + lam) * (0.5 * ((dd + gg) - vv))
    else:
        num = f_decrease * (1.0 + lam) / lr - (sums[..., 3] + lam * sums[..., 4])
        # a float64 f_decrease must not promote a float32 scope
        num = cast(xp, num, sums.dtype)
    beta = apply_variant(xp, guarded_ratio(xp, num, vv, dd + gg, cfg.beta_max), cfg)
    return beta, (beta + lam) / (1.0 + lam)


def _is_one(value: Any) -> bool:
    """Whether a learning-rate ratio is absent or the number 1 (no array: an array may
    hold any value and is used as it is)."""
    return value is None or (isinstance(value, (int, float)) and value == 1.0)


class _Columns:
    """``sums[..., k]`` made of given columns (arrays, or a tape's recorded values)."""

    def __init__(self, values: tuple) -> None:
        self.values = values
        self.dtype = values[0].dtype
        self.shape = (len(values),)

    def __getitem__(self, key: Any) -> Any:
        return self.values[key[1]]


def momentum_beta_of_dots(
    xp: Any,
    dots: Array,
    cfg: Any,
    *,
    base: Any = None,
    lr: float | None = None,
    exact: bool = False,
    f_decrease: Any = None,
) -> tuple[Array, Array]:
    r""":func:`momentum_beta` (or ``base``) from a device split's three dots per scope.

    ``dots[..., :3]`` are :math:`\langle v,v\rangle, \langle g,g\rangle,
    \langle v,g\rangle`; :math:`\langle d,d\rangle = \langle v,v\rangle +
    2\langle v,g\rangle + \langle g,g\rangle` and :math:`\langle v,d\rangle =
    \langle v,v\rangle + \langle v,g\rangle` are formed from them in that order, as the
    host forms them (``amopt.optimize.split._momentum_sums_of``). With ``exact`` the decrease of
    f is ``f_decrease``, or ``dots[..., 3]`` when that is None (a recorded tape's input).
    """
    base = momentum_beta if base is None else base
    vv, gg, vg = dots[..., 0], dots[..., 1], dots[..., 2]
    dd = vv + 2.0 * vg + gg
    cols = (vv, gg, dd, vg, vv + vg) if exact else (vv, gg, dd)
    if exact and f_decrease is None:
        f_decrease = dots[..., 3]
    return base(xp, _Columns(cols), cfg, lr=lr, f_decrease=f_decrease if exact else None)


def adam_weights(
    cfg: Any, *, lr: float, weight_decay: float, exact: bool = False, lr_ratio: Any = 1.0
) -> tuple[float, ...]:
    r"""Weights :math:`a_k` of the AM-Adam(W) numerator's elementwise terms.

    The reduce kernels accumulate :math:`\sum_k a_k\, \text{term}_k` over a scope, with
    the terms :data:`ADAM_TERMS` (linearised) or :data:`ADAM_EXACT_TERMS` (exact; the
    f values are added by :func:`adam_beta`): algorithms.md section 3, step 4,

    .. math::

        N = \textstyle\sum \frac{g^2}{p} - \lambda u (d-g)^2 + \mu\eta\frac{g d}{p}
            + \mu(2+\mu\eta) g x - \mu d x
            + (r - 1)(1 + \mu\eta)\big(\frac{g d}{p} + \mu g x\big),
        \qquad N_{exact} = (1+\mu\eta)\frac{f_{prev}-f}{\eta}
            - \sum w(d-g)g - \lambda \sum u (d-g) d - \mu \sum x(d-g),

    with :math:`\eta = \eta_t` and :math:`r = \eta_{t-1}/\eta_t` (``lr_ratio``):
    Supplement D's estimate :math:`\hat f - f = \eta_{t-1} g^\top(P^{-1}d + \mu x)`
    takes the previous step's learning rate. At :math:`r = 1` (a constant learning
    rate, a scope's first step, :math:`\eta_t = 0`) the last term is absent. A zero
    weight means the term may be skipped.
    """
    lam, wd = float(cfg.lam), float(weight_decay)
    if exact:
        return (-1.0, -lam, -wd)
    if _is_one(lr_ratio):
        return (1.0, -lam, wd * lr, wd * (2.0 + wd * lr), -wd)
    extra = (lr_ratio - 1.0) * (1.0 + wd * lr)
    return (1.0, -lam, wd * lr + extra, wd * (2.0 + wd * lr) + wd * extra, -wd)


def lr_ratio(prev_lr: Any, lr: Any) -> Any:
    r""":math:`r = \eta_{t-1} / \eta_t` of two learning rates (Python numbers): 1 where
    there is no previous step (``prev_lr`` None) or :math:`\eta_t = 0` (algorithms.md,
    section 2 step 3)."""
    if prev_lr is None or lr == 0:
        return 1.0
    return float(prev_lr) / float(lr)


def adam_correction(prod: Array, cfg: Any) -> Array:
    r"""Bias correction :math:`c = 1 - \beta_{1,\max} \prod_{s<t} \beta_s` of each scope."""
    return 1.0 - float(cfg.beta_max) * prod


def adam_beta(
    xp: Any,
    sums: Array,
    cfg: Any,
    *,
    lr: float | None = None,
    weight_decay: float = 0.0,
    f_decrease: Any = None,
    first: Any = None,
) -> Array:
    r"""AM-Adam(W): beta of each scope from its sums :data:`ADAM_SUMS`.

    .. math::

        \beta = \operatorname{clip}(N / D, 0, \beta_{1,\max}),

    when :math:`D \le \epsilon^2 (\sum w d^2 + \sum w g^2)` 0, or :math:`\beta_{1,\max}`
    on a scope's first step (``first``), then the variant. ``N`` is ``sums[..., 0]``
    (weighted by :func:`adam_weights`), plus :math:`(1+\mu\eta)(f_{prev}-f)/\eta` for
    the exact numerator (``f_decrease``). The momentum update is :math:`d \leftarrow g
    + \frac{\beta + \lambda p}{1 + \lambda p}(d - g)` (elementwise, in the apply
    kernel) and the running product :math:`\pi \leftarrow \pi\beta`.

    ``first`` (nonzero on a scope's first step, where :math:`d = 0` and :math:`N = D`
    for every nonzero :math:`g`; a number or an array over the scopes; ``None``: no
    first step) gives a vanishing :math:`D` there, a gradient that is exactly zero
    (a zero-initialised layer), the limit :math:`\beta_{1,\max}` rather than 0, so that
    the product :math:`\pi` keeps Adam's first bias correction (algorithms.md, section 3
    step 5): :math:`\pi = 0` would remove it for good.
    """
    num, den, ref = sums[..., 0], sums[..., 1], sums[..., 2]
    if f_decrease is not None:
        num = num + (1.0 + weight_decay * lr) * f_decrease / lr
        num = cast(xp, num, sums.dtype)
    degenerate: Any = 0.0
    if first is not None:
        cap = float(cfg.beta_max)
        if isinstance(first, (bool, int, float)):
            degenerate = cap if first else 0.0
        else:  # in the sums' dtype (a Python cap in where would give torch's default one)
            degenerate = xp.where(first != 0, xp.full_like(den, cap), xp.zeros_like(den))
    return apply_variant(xp, guarded_ratio(xp, num, den, ref, cfg.beta_max, degenerate), cfg)
