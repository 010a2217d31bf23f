"""The methods of ``amopt.minimize``: one ``_minimize_<method>`` per method.

As in scipy, a method's options are the keyword arguments of its
``_minimize_<method>`` function, documented in its "Options" section.
"""

from __future__ import annotations

from collections.abc import Callable

from scipy.optimize import OptimizeResult

from amopt import _core
from amopt._config import (
    AMConfig,
    check_betas,
    check_interval,
    check_nonnegative,
    check_positive,
    check_weight_decay_mode,
)
from amopt._loop import _check_unknown_options, _run, _sampling

__all__ = ["METHODS"]


def _minimize_gd(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    weight_decay=0.0,
    maxiter=1000,
    gtol=1e-5,
    **unknown_options,
) -> OptimizeResult:
    r"""Gradient descent, :math:`x_{t+1} = x_t - \eta \nabla f(x_t)`.

    Options
    -------
    lr : float
        Step size :math:`\eta > 0` (``1/L`` for an L-smooth f).
    weight_decay : float
        Coupled L2 weight decay :math:`\mu \ge 0`: the method minimises
        :math:`F = f + \frac{\mu}{2}\|x\|^2`, stepping along :math:`g + \mu x`.
        ``res.fun`` and ``res.jac`` (and the callback's) stay :math:`f` and
        :math:`\nabla f`, the values of ``fun`` and ``jac``.
    maxiter : int
        Maximum number of steps.
    gtol : float
        Stop when :math:`\max|\nabla F| = \max|g + \mu x| \le` ``gtol``; 0 disables the test.
    """
    _check_unknown_options(unknown_options)
    lr = check_positive("lr", lr)
    wd = check_nonnegative("weight_decay", weight_decay)

    def step(xs, gs, f, state):
        return _core.gd_step(xs, gs, lr=lr), None, None

    return _run(
        fun,
        x0,
        args,
        jac,
        callback,
        step=step,
        maxiter=maxiter,
        gtol=gtol,
        is_am=False,
        weight_decay=wd,
    )


def _heavy_ball(lr, beta):
    # weight decay is coupled by _run: gs is already g + wd * x
    def step(xs, gs, f, state):
        state = _core.heavy_ball_init(xs) if state is None else state
        xs, state = _core.heavy_ball_step(xs, gs, state, lr=lr, beta=beta)
        return xs, state, None

    return step


def _minimize_mgd(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    beta=0.9,
    weight_decay=0.0,
    maxiter=1000,
    gtol=1e-5,
    **unknown_options,
) -> OptimizeResult:
    r"""Damped heavy ball (MGD) with fixed momentum ``beta``.

    .. math::

        d_0 = g_0,\quad d_{t+1} = \beta d_t + (1-\beta) g_t,\quad x_{t+1} = x_t - \eta d_{t+1}

    Options
    -------
    lr : float
        Step size :math:`\eta > 0`.
    beta : float
        Momentum coefficient in [0, 1].
    weight_decay : float
        Coupled L2 weight decay :math:`\mu \ge 0`: the method minimises
        :math:`F = f + \frac{\mu}{2}\|x\|^2`, stepping along :math:`g + \mu x`.
        ``res.fun`` and ``res.jac`` (and the callback's) stay :math:`f` and
        :math:`\nabla f`, the values of ``fun`` and ``jac``.
    maxiter : int
        Maximum number of steps.
    gtol : float
        Stop when :math:`\max|\nabla F| = \max|g + \mu x| \le` ``gtol``; 0 disables the test.
    """
    _check_unknown_options(unknown_options)
    step = _heavy_ball(check_positive("lr", lr), check_interval("beta", beta, 0.0, 1.0))
    return _run(
        fun,
        x0,
        args,
        jac,
        callback,
        step=step,
        maxiter=maxiter,
        gtol=gtol,
        is_am=False,
        weight_decay=check_nonnegative("weight_decay", weight_decay),
    )


def _am_momentum(lr, config):
    # weight decay is coupled by _run: gs is g + wd * x and f is f + wd/2 |x|^2
    def step(xs, gs, f, state):
        state = _core.am_momentum_init(xs) if state is None else state
        return _core.am_momentum_step(xs, gs, state, lr=lr, f=f, config=config)

    return step


def _minimize_am_mgd(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    lam=0.0,
    beta_max=1.0,
    numerator="exact",
    weight_decay=0.0,
    per_layer=False,
    variant=None,
    beta_min=0.5,
    theta=0.7,
    beta_high=0.9,
    beta_low=0.1,
    maxiter=1000,
    gtol=1e-5,
    **unknown_options,
) -> OptimizeResult:
    r"""Adaptive Memory momentum gradient descent (AM-MGD).

    .. math::

        \beta_t &= \operatorname{clip}\Big(
            \frac{(f(x_{t-1}) - f(x_t))(1+\lambda)/\eta
                  - \langle d_t - g_t, g_t + \lambda d_t\rangle}
                 {\|d_t - g_t\|^2}, 0, \beta_{\max}\Big) \\
        d_{t+1} &= g_t + \tfrac{\beta_t+\lambda}{1+\lambda}(d_t - g_t), \qquad
        x_{t+1} = x_t - \eta\, d_{t+1}

    with :math:`d_0 = g_0` and :math:`\beta_t = 0` when the denominator vanishes.

    Options
    -------
    lr : float
        Step size :math:`\eta > 0` (the paper uses ``1/L``).
    lam : float
        Proximal regularisation :math:`\lambda \ge 0`.
    beta_max : float
        Upper bound of :math:`\beta_t`, in [0, 1].
    numerator : {"exact", "linear"}
        ``"exact"`` uses the decrease of the objective (needs f values; with
        ``weight_decay``, of :math:`F` below); ``"linear"`` the linearised
        numerator :math:`(1+\lambda)\|g\|^2 - \lambda\|d-g\|^2`.
    weight_decay : float
        Coupled L2 weight decay :math:`\mu \ge 0`: the method minimises
        :math:`F = f + \frac{\mu}{2}\|x\|^2`, stepping along :math:`g + \mu x`.
        ``res.fun`` and ``res.jac`` (and the callback's) stay :math:`f` and
        :math:`\nabla f`, the values of ``fun`` and ``jac``.
    per_layer : bool
        With a list of arrays as ``x0``: one beta per array instead of one global beta.
    variant : {None, "clip", "restart"}
        ``"clip"``: :math:`\max(\beta_t, \beta_{\min})`; ``"restart"``:
        ``beta_high`` if :math:`\beta_t \ge \theta` else ``beta_low``.
    beta_min, theta, beta_high, beta_low : float
        Variant parameters, in [0, 1].
    maxiter : int
        Maximum number of steps.
    gtol : float
        Stop when :math:`\max|\nabla F| = \max|g + \mu x| \le` ``gtol``; 0 disables the test.
    """
    _check_unknown_options(unknown_options)
    am = AMConfig.from_options(locals())
    step = _am_momentum(check_positive("lr", lr), am)
    return _run(
        fun,
        x0,
        args,
        jac,
        callback,
        step=step,
        maxiter=maxiter,
        gtol=gtol,
        is_am=True,
        weight_decay=check_nonnegative("weight_decay", weight_decay),
        decay_in_f=am.numerator == "exact",
    )


def _minimize_sgd(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    weight_decay=0.0,
    maxiter=1000,
    batch_size=None,
    seed=None,
    replace=False,
    gtol=0.0,
    **unknown_options,
) -> OptimizeResult:
    r"""Stochastic gradient descent on a :class:`~amopt.FiniteSum` (or a stochastic oracle).

    Options
    -------
    lr : float
        Step size.
    weight_decay : float
        Coupled L2 weight decay :math:`\mu \ge 0`: the method minimises
        :math:`F = f + \frac{\mu}{2}\|x\|^2`, stepping along :math:`g + \mu x`.
        ``res.fun`` and ``res.jac`` (and the callback's ``fun``) stay :math:`f`
        and :math:`\nabla f`, the values of ``fun``.
    maxiter : int
        Number of mini-batch steps.
    batch_size : int
        Mini-batch size when ``fun`` is a FiniteSum; default
        ``min(32, fun.n_samples)``. Without replacement it is at most
        ``fun.n_samples``.
    seed : int, numpy.random.Generator or None
        Seed of the sampler; the same seed gives the same trajectory. Ignored
        (with an ``OptimizeWarning``) when nothing is sampled.
    replace : bool
        ``False`` (default): epochs of random reshuffling, every sample once per
        epoch. ``True``: i.i.d. uniform indices with replacement (the theory setting).
    gtol : float
        Stop when the mini-batch :math:`\max|g + \mu x| \le` ``gtol``; 0 (default)
        disables the test.

    Notes
    -----
    With a plain callable ``fun``, it is treated as a (possibly stochastic)
    oracle: each step evaluates it once at the current iterate.
    """
    _check_unknown_options(unknown_options)
    lr = check_positive("lr", lr)
    wd = check_nonnegative("weight_decay", weight_decay)

    def step(xs, gs, f, state):
        return _core.gd_step(xs, gs, lr=lr), None, None

    sampling = _sampling(fun, batch_size, seed, replace, gtol, always=True)
    return _run(
        fun,
        x0,
        args,
        jac,
        callback,
        step=step,
        maxiter=maxiter,
        is_am=False,
        weight_decay=wd,
        **sampling,
    )


def _minimize_msgd(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    beta=0.9,
    weight_decay=0.0,
    maxiter=1000,
    batch_size=None,
    seed=None,
    replace=False,
    gtol=0.0,
    **unknown_options,
) -> OptimizeResult:
    r"""Stochastic damped heavy ball (MSGD) with fixed ``beta``.

    Options
    -------
    lr, beta, weight_decay
        As for ``"mgd"``.
    maxiter, batch_size, seed, replace, gtol
        As for ``"sgd"``.
    """
    _check_unknown_options(unknown_options)
    step = _heavy_ball(check_positive("lr", lr), check_interval("beta", beta, 0.0, 1.0))
    sampling = _sampling(fun, batch_size, seed, replace, gtol, always=True)
    return _run(
        fun,
        x0,
        args,
        jac,
        callback,
        step=step,
        maxiter=maxiter,
        is_am=False,
        weight_decay=check_nonnegative("weight_decay", weight_decay),
        **sampling,
    )


def _minimize_am_sgd(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    lam=0.1,
    beta_max=0.9,
    numerator="linear",
    weight_decay=0.0,
    per_layer=False,
    variant=None,
    beta_min=0.5,
    theta=0.7,
    beta_high=0.9,
    beta_low=0.1,
    maxiter=1000,
    batch_size=None,
    seed=None,
    replace=False,
    gtol=0.0,
    **unknown_options,
) -> OptimizeResult:
    r"""Adaptive Memory momentum SGD (AM-MSGD), the paper's stochastic rule.

    .. math::

        \beta_t = \operatorname{clip}\Big(
            \frac{(1+\lambda)\|g_t\|^2 - \lambda \|d_t - g_t\|^2}{\|d_t - g_t\|^2},
            0, \beta_{\max}\Big), \quad
        d_{t+1} = g_t + \tfrac{\beta_t+\lambda}{1+\lambda}(d_t - g_t), \quad
        x_{t+1} = x_t - \eta\, d_{t+1}

    Options
    -------
    lr, lam, beta_max, numerator, weight_decay, per_layer, variant
        As for ``"am-mgd"``, with defaults ``lam=0.1``, ``beta_max=0.9``,
        ``numerator="linear"`` (the exact numerator would compare f on two
        different mini-batches; with ``weight_decay`` it uses the decrease of
        the mini-batch :math:`F = f + \frac{\mu}{2}\|x\|^2`).
    beta_min, theta, beta_high, beta_low
        As for ``"am-mgd"``.
    maxiter, batch_size, seed, replace, gtol
        As for ``"sgd"``.
    """
    _check_unknown_options(unknown_options)
    am = AMConfig.from_options(locals())
    step = _am_momentum(check_positive("lr", lr), am)
    sampling = _sampling(fun, batch_size, seed, replace, gtol, always=True)
    return _run(
        fun,
        x0,
        args,
        jac,
        callback,
        step=step,
        maxiter=maxiter,
        is_am=True,
        weight_decay=check_nonnegative("weight_decay", weight_decay),
        decay_in_f=am.numerator == "exact",
        **sampling,
    )


def _adam_family(
    fun,
    x0,
    args,
    jac,
    callback,
    *,
    lr,
    betas,
    eps,
    weight_decay,
    decoupled,
    maxiter,
    gtol,
    batch_size,
    seed,
    replace,
):
    lr = check_positive("lr", lr)
    betas = check_betas("betas", betas)
    eps = check_nonnegative("eps", eps)
    wd = check_nonnegative("weight_decay", weight_decay)

    # L2 decay (Adam) is coupled by _run, decoupled decay (AdamW) applied by the core
    core_wd = wd if decoupled else 0.0

    def step(xs, gs, f, state):
        state = _core.adam_init(xs) if state is None else state
        xs, state = _core.adam_step(
            xs, gs, state, lr=lr, betas=betas, eps=eps, weight_decay=core_wd, decoupled=decoupled
        )
        return xs, state, None

    sampling = _sampling(fun, batch_size, seed, replace, gtol, always=False)
    return _run(
        fun,
        x0,
        args,
        jac,
        callback,
        step=step,
        maxiter=maxiter,
        is_am=False,
        weight_decay=0.0 if decoupled else wd,
        **sampling,
    )


def _minimize_adam(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    maxiter=1000,
    gtol=None,
    batch_size=None,
    seed=None,
    replace=False,
    **unknown_options,
) -> OptimizeResult:
    r"""Adam, exactly as ``torch.optim.Adam`` (L2 weight decay added to the gradient).

    .. math::

        m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\;
        v_t = \beta_2 v_{t-1} + (1-\beta_2) g_t^2,\;
        x_t = x_{t-1} - \frac{\eta}{1-\beta_1^t}\frac{m_t}{\sqrt{v_t/(1-\beta_2^t)}+\epsilon}

    Options
    -------
    lr : float
        Learning rate.
    betas : (float, float)
        :math:`(\beta_1, \beta_2)`, each in [0, 1).
    eps : float
        Denominator term :math:`\epsilon \ge 0`.
    weight_decay : float
        L2 penalty :math:`\mu \ge 0` added to the gradient (coupled): the method
        minimises :math:`F = f + \frac{\mu}{2}\|x\|^2`, stepping along
        :math:`g + \mu x`. ``res.fun`` and ``res.jac`` (and the callback's) stay
        :math:`f` and :math:`\nabla f`, the values of ``fun`` and ``jac``.
    maxiter : int
        Maximum number of steps.
    gtol : float
        Stop when :math:`\max|g + \mu x| \le` ``gtol`` (the mini-batch gradient with
        ``batch_size``); default 1e-5 full batch, 0 (off) with ``batch_size``.
    batch_size, seed, replace
        With a :class:`~amopt.FiniteSum` ``fun``: mini-batch steps (see ``"sgd"``);
        ``batch_size=None`` uses the full gradient.
    """
    _check_unknown_options(unknown_options)
    return _adam_family(
        fun,
        x0,
        args,
        jac,
        callback,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        decoupled=False,
        maxiter=maxiter,
        gtol=gtol,
        batch_size=batch_size,
        seed=seed,
        replace=replace,
    )


def _minimize_adamw(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=1e-2,
    maxiter=1000,
    gtol=None,
    batch_size=None,
    seed=None,
    replace=False,
    **unknown_options,
) -> OptimizeResult:
    r"""AdamW, exactly as ``torch.optim.AdamW`` (decoupled weight decay).

    Options
    -------
    lr, betas, eps, maxiter, batch_size, seed, replace
        As for ``"adam"``.
    weight_decay : float
        Decoupled weight decay :math:`\mu \ge 0`: :math:`x \leftarrow (1 - \eta\mu) x`
        before the step.
        The decoupled decay is not the gradient of an objective: ``res.fun``
        and ``res.jac`` are :math:`f` and :math:`\nabla f`, and ``gtol`` tests
        :math:`\max|\nabla f|` (at a fixed point of the decoupled iteration
        :math:`\nabla f` is of order :math:`\epsilon\mu|x|`).
    gtol : float
        Stop when :math:`\max|\nabla f| \le` ``gtol`` (the mini-batch gradient with
        ``batch_size``); default 1e-5 full batch, 0 (off) with ``batch_size``.
    """
    _check_unknown_options(unknown_options)
    return _adam_family(
        fun,
        x0,
        args,
        jac,
        callback,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        decoupled=True,
        maxiter=maxiter,
        gtol=gtol,
        batch_size=batch_size,
        seed=seed,
        replace=replace,
    )


def _am_adam_family(
    fun,
    x0,
    args,
    jac,
    callback,
    *,
    lr,
    betas,
    eps,
    weight_decay,
    mode,
    maxiter,
    gtol,
    batch_size,
    seed,
    replace,
    am,
):
    lr = check_positive("lr", lr)
    betas = check_betas("betas", betas)
    eps = check_nonnegative("eps", eps)
    wd = check_nonnegative("weight_decay", weight_decay)
    config = am
    # the L2 penalty (AM-Adam) is coupled by _run; decoupled/proximal decay is the core's
    l2 = mode == "l2"

    def step(xs, gs, f, state):
        state = _core.am_adam_init(xs) if state is None else state
        return _core.am_adam_step(
            xs,
            gs,
            state,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=0.0 if l2 else wd,
            weight_decay_mode="decoupled" if l2 else mode,
            f=f,
            config=config,
        )

    sampling = _sampling(fun, batch_size, seed, replace, gtol, always=False)
    return _run(
        fun,
        x0,
        args,
        jac,
        callback,
        step=step,
        maxiter=maxiter,
        is_am=True,
        weight_decay=wd if l2 else 0.0,
        **sampling,
    )


def _minimize_am_adam(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    lam=0.1,
    numerator="linear",
    per_layer=True,
    variant=None,
    beta_min=0.5,
    theta=0.7,
    beta_high=0.9,
    beta_low=0.1,
    maxiter=1000,
    gtol=None,
    batch_size=None,
    seed=None,
    replace=False,
    **unknown_options,
) -> OptimizeResult:
    r"""AM-Adam: Adam whose first-moment coefficient is the Adaptive Memory beta.

    .. math::

        p_t &= (1 - \beta_{1,\max}\textstyle\prod_{s<t}\beta_s)(\epsilon + \sqrt{\hat v_t}), \quad
        \beta_t = \operatorname{clip}(N_t / D_t, 0, \beta_{1,\max}) \\
        d_{t+1} &= g_t + \frac{\beta_t + \lambda p_t}{1 + \lambda p_t}(d_t - g_t), \quad
        x_{t+1} = x_t - \eta\, d_{t+1} / p_t

    (``N``, ``D`` as in :func:`amopt.am_adam_beta`; algorithms.md section 3.)

    Options
    -------
    lr : float
        Learning rate.
    betas : (float, float)
        :math:`(\beta_{1,\max}, \beta_2)`, each in [0, 1).
    eps : float
        Denominator term.
    weight_decay : float
        L2 penalty :math:`\mu \ge 0` added to the gradient, as for ``"adam"``
        (AM-Adam has no decoupled decay): the steps and ``gtol`` use
        :math:`g + \mu x`, ``res.fun`` and ``res.jac`` are :math:`f` and
        :math:`\nabla f`.
    lam : float
        Proximal regularisation :math:`\lambda \ge 0` (default 0.1).
    numerator : {"linear", "exact"}
        ``"exact"`` uses the decrease of f (full batch only makes sense). It is
        the decrease of ``fun`` itself, without the ``weight_decay`` penalty
        (algorithms.md section 3: the L2 penalty enters the gradient only).
    per_layer : bool
        One beta per array of ``x0`` (default) or one global beta.
    variant, beta_min, theta, beta_high, beta_low
        As for ``"am-mgd"``.
    maxiter, gtol, batch_size, seed, replace
        As for ``"adam"``.
    """
    _check_unknown_options(unknown_options)
    am = AMConfig.from_options(locals(), beta_max=check_betas("betas", betas)[0])
    return _am_adam_family(
        fun,
        x0,
        args,
        jac,
        callback,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        mode="l2",
        maxiter=maxiter,
        gtol=gtol,
        batch_size=batch_size,
        seed=seed,
        replace=replace,
        am=am,
    )


def _minimize_am_adamw(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=1e-2,
    weight_decay_mode="decoupled",
    lam=0.1,
    numerator="linear",
    per_layer=True,
    variant=None,
    beta_min=0.5,
    theta=0.7,
    beta_high=0.9,
    beta_low=0.1,
    maxiter=1000,
    gtol=None,
    batch_size=None,
    seed=None,
    replace=False,
    **unknown_options,
) -> OptimizeResult:
    r"""AM-AdamW: AM-Adam with decoupled (or proximal) weight decay.

    .. math::

        x_{t+1} = (1 - \eta\mu)\, x_t - \eta\, d_{t+1}/p_t \quad\text{(decoupled)},\qquad
        x_{t+1} = \frac{x_t - \eta\, d_{t+1}/p_t}{1 + \eta\mu} \quad\text{(proximal)}

    The beta rule includes the weight-decay terms of algorithms.md section 3;
    with ``numerator="exact"`` it is the paper's general formula with
    :math:`f(x_{t-1}) - f(x_t)`.

    Options
    -------
    weight_decay : float
        :math:`\mu \ge 0` (default 1e-2, as ``torch.optim.AdamW``).
        The decoupled decay is not the gradient of an objective: ``res.fun``
        and ``res.jac`` are :math:`f` and :math:`\nabla f`, and ``gtol`` tests
        :math:`\max|\nabla f|` (at a fixed point of the decoupled iteration
        :math:`\nabla f` is of order :math:`\epsilon\mu|x|`).
    weight_decay_mode : {"decoupled", "proximal"}
        How the decay is applied.
    lr, betas, eps, lam, numerator, per_layer, variant, beta_min, theta, beta_high, beta_low
        As for ``"am-adam"``.
    gtol : float
        As for ``"adamw"``.
    maxiter, batch_size, seed, replace
        As for ``"adam"``.
    """
    _check_unknown_options(unknown_options)
    am = AMConfig.from_options(locals(), beta_max=check_betas("betas", betas)[0])
    mode = check_weight_decay_mode(weight_decay_mode)
    return _am_adam_family(
        fun,
        x0,
        args,
        jac,
        callback,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        mode=mode,
        maxiter=maxiter,
        gtol=gtol,
        batch_size=batch_size,
        seed=seed,
        replace=replace,
        am=am,
    )


METHODS: dict[str, Callable[..., OptimizeResult]] = {
    "gd": _minimize_gd,
    "mgd": _minimize_mgd,
    "am-mgd": _minimize_am_mgd,
    "adam": _minimize_adam,
    "adamw": _minimize_adamw,
    "am-adam": _minimize_am_adam,
    "am-adamw": _minimize_am_adamw,
    "sgd": _minimize_sgd,
    "msgd": _minimize_msgd,
    "am-sgd": _minimize_am_sgd,
}
