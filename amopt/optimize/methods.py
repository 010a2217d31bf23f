"""The methods of ``amopt.minimize``: one ``_minimize_<method>`` per method.

As in scipy, a method's options are the keyword arguments of its
``_minimize_<method>`` function, documented in its "Options" section; unknown
options give an ``OptimizeWarning``, and the result is an ``OptimizeResult``.

Each ``_minimize_<method>`` is made by :func:`_method` from the method's
declaration: its step factory (below: it validates the options and returns the core
step), its options with their defaults and its docstring. What methods share is
written once: the defaults of the loop's and the sampler's options in the groups
below, those of the AM rule as the fields of :class:`~amopt.core.config.AMConfig`, and
the descriptions that several docstrings repeat in ``_DOCS``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

from scipy.optimize import OptimizeResult

from amopt.core.config import (
    AMConfig,
    check_betas,
    check_interval,
    check_nonnegative,
    check_positive,
    check_weight_decay_mode,
)
from amopt.optimize import split as _split
from amopt.optimize import steps as _core
from amopt.optimize.loop import _check_unknown_options, _run, _sampling

__all__ = ["METHODS"]

# ----------------------------------------------------------------------------- options


class _Loop(NamedTuple):
    """The options of the loop and the sampler, and how the method samples."""

    options: dict[str, Any]
    #: None: full batch; True: every step on a mini-batch of a FiniteSum ``fun``;
    #: False: only with ``batch_size`` (see :func:`amopt.optimize.loop._sampling`)
    always_sample: bool | None


_SAMPLER = {"batch_size": None, "seed": None, "replace": False}
#: scipy's ``disp``: print the final message and the counters
_DISP = {"disp": False}
_FULL_BATCH = _Loop({"maxiter": 1000, "gtol": 1e-5, **_DISP}, None)
#: the sgd-type methods: their gradient test is off by default
_MINI_BATCH = _Loop({"maxiter": 1000, **_SAMPLER, "gtol": 0.0, **_DISP}, True)
#: the Adam family; ``gtol=None``: 1e-5 full batch, 0 with ``batch_size``
_OPTIONAL_BATCH = _Loop({"maxiter": 1000, "gtol": None, **_SAMPLER, **_DISP}, False)
_ADAM = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8}
#: the options of the AM rule, with the defaults of AMConfig (AM-MGD's)
_AM_RULE = {f.name: f.default for f in dataclasses.fields(AMConfig)}
#: AM-MGD's: the linearised numerator by default. The exact numerator (the paper's
#: Algorithm 1) keeps beta near 1 close to the optimum, where the decrease of f is
#: second order, and the gap then falls like 1/t: least squares 200x20 at lr = 1/L
#: takes more than 10,000 iterations to gtol 1e-8 against GD's 51 and the linear
#: numerator's 31 (docs/choosing-a-method.md has the measured problem set)
_AM_MGD = _AM_RULE | {"numerator": "linear", "beta_max": None}
#: AM-MGD's cap of beta when ``beta_max`` is not given, per numerator. The exact rule
#: is the paper's Algorithm 1 (cap 1). With the linear numerator a cap of 1 lets beta
#: sit at ~0.9999 on ill-conditioned problems: d then barely takes in new gradients
#: (their weight is 1 - beta) and the iterates lag GD's (condition-1e5 quadratic,
#: lr = 1/L: f - f_GD = +7.9e3 at 1,000 iterations, +1.9e4 at 5,000, +3.0e4 at
#: 20,000). A cap of 0.998 (a memory of at most ~500 steps) is ahead of GD on every
#: convex problem of the measured set at 1,000 and 5,000 iterations, where 0.9999
#: and 1 are behind on that quadratic and 0.999 is behind at 1,000
#: (docs/choosing-a-method.md).
_AM_MGD_BETA_MAX = {"linear": 0.998, "exact": 1.0}
#: AM-MSGD's and AM-Adam's: the paper's stochastic setting
_AM_STOCHASTIC = {**_AM_RULE, "lam": 0.1, "beta_max": 0.9, "numerator": "linear"}
#: AM-Adam's: the cap of beta is ``betas[0]``, and one beta per array by default
_AM_ADAM = {k: v for k, v in _AM_STOCHASTIC.items() if k != "beta_max"} | {"per_layer": True}

_DOCS = {
    "weight_decay": r"""weight_decay : float
        Coupled L2 weight decay :math:`\mu \ge 0`: the method minimises
        :math:`F = f + \frac{\mu}{2}\|x\|^2`, stepping along :math:`g + \mu x`.
        ``res.fun`` and ``res.jac`` (and the callback's) stay :math:`f` and
        :math:`\nabla f`, the values of ``fun`` and ``jac``.""",
    "full_batch": r"""maxiter : int
        Maximum number of steps.
    gtol : float
        Stop when :math:`\max|\nabla F| = \max|g + \mu x| \le` ``gtol``; 0 disables the test.""",
    "lr": r"""lr : float or None
        Step size :math:`\eta > 0`. None (default): :math:`1/L` (with coupled
        ``weight_decay`` :math:`\mu`, :math:`1/(L+\mu)`), :math:`L` from
        ``fun.L`` when ``fun`` has it (every :mod:`amopt.problems` class but
        ``Rosenbrock``), else estimated at ``x0`` by a power iteration on
        gradient differences, safeguarded by halving until the first gradient
        step meets Armijo's condition (at most 20 + a few evaluations, counted in
        ``nfev``); the step used is ``res.lr``.""",
    "disp": r"""disp : bool
        Print the final message and the counters, as scipy's methods do.""",
    "decoupled": r"""The decoupled decay is not the gradient of an objective: ``res.fun``
        and ``res.jac`` are :math:`f` and :math:`\nabla f`, and ``gtol`` tests
        :math:`\max|\nabla f|` (at a fixed point of the decoupled iteration
        :math:`\nabla f` is of order :math:`\epsilon\mu|x|`).""",
}


def _display(res: OptimizeResult) -> None:
    """What scipy's gradient methods print with ``disp=True``."""
    print(res.message if res.success else "Warning: " + res.message)
    print(f"         Current function value: {float(res.fun):f}")
    print(f"         Iterations: {res.nit:d}")
    print(f"         Function evaluations: {res.nfev:d}")
    print(f"         Gradient evaluations: {res.njev:d}")


# ----------------------------------------------------------------------------- steps


class _Split(NamedTuple):
    r"""An AM step cut at the rule, for device arrays (see :mod:`amopt.backends.device`).

    ``sums(xs, gs, state) -> (state, pending, sums)`` queues the reduce on the device
    (``state`` None: the initial state); ``apply(xs, gs, f, state, pending, values)
    -> (xs, state, beta)`` runs the rule on the host ``values`` of ``sums`` and queues
    the update. ``g_sq(values)``, where given, is :math:`\|g\|^2` over all arrays from
    those values (the loop then reads nothing else for the gradient). With
    ``on_device``, ``apply`` also takes the ``sums`` arrays themselves and runs the rule
    on the device (the pipelined loop, which does not wait for the values).
    """

    sums: Callable
    apply: Callable
    g_sq: Callable | None = None
    on_device: bool = False


# A step factory takes the method's options (given or default) and returns the core
# step ``step(xs, gs, f, state) -> (xs, state, beta)`` and the keyword arguments of
# ``_run`` that depend on the method: ``weight_decay`` is the decay that ``_run``
# couples (it steps with g + wd * x; with ``decay_in_f``, f is f + wd/2 |x|^2).


def _weight_decay(options: dict) -> float:
    return check_nonnegative("weight_decay", options["weight_decay"])


def _gd(options: dict) -> tuple[Callable, dict]:
    lr = check_positive("lr", options["lr"])

    def step(xs, gs, f, state):
        return _core.gd_step(xs, gs, lr=lr), None, None

    return step, {"weight_decay": _weight_decay(options), "growth": ("gd", lr)}


def _heavy_ball(options: dict) -> tuple[Callable, dict]:
    lr = check_positive("lr", options["lr"])
    beta = check_interval("beta", options["beta"], 0.0, 1.0)

    def step(xs, gs, f, state):
        state = _core.heavy_ball_init(xs) if state is None else state
        xs, state = _core.heavy_ball_step(xs, gs, state, lr=lr, beta=beta)
        return xs, state, None

    return step, {"weight_decay": _weight_decay(options), "growth": ("heavy_ball", lr)}


def _classical(options: dict, *, nesterov: bool) -> tuple[Callable, dict]:
    lr = check_positive("lr", options["lr"])
    beta = check_interval("beta", options["beta"], 0.0, 1.0)

    def step(xs, gs, f, state):
        state = _core.heavy_ball_init(xs) if state is None else state
        xs, state = _core.classical_momentum_step(
            xs, gs, state, lr=lr, beta=beta, nesterov=nesterov
        )
        return xs, state, None

    kind = "nesterov" if nesterov else "classical"
    return step, {"weight_decay": _weight_decay(options), "growth": (kind, lr, beta)}


def _am_momentum(options: dict) -> tuple[Callable, dict]:
    if options.get("beta_max", 0.0) is None:  # AM-MGD's default: per numerator
        # an unknown numerator keeps None and AMConfig names it in its error
        options = options | {"beta_max": _AM_MGD_BETA_MAX.get(options["numerator"], 1.0)}
    config = AMConfig.from_options(options)
    lr = check_positive("lr", options["lr"])

    def step(xs, gs, f, state):
        state = _core.am_momentum_init(xs) if state is None else state
        return _core.am_momentum_step(xs, gs, state, lr=lr, f=f, config=config)

    def sums(xs, gs, state):
        state = _core.am_momentum_init(xs) if state is None else state
        return (state, *_split.am_momentum_sums(xs, gs, state, config=config))

    def apply(xs, gs, f, state, pending, values):
        return _split.am_momentum_apply(xs, gs, state, pending, values, lr=lr, f=f, config=config)

    wd = _weight_decay(options)
    run = {"is_am": True, "weight_decay": wd, "decay_in_f": config.numerator == "exact"}

    def g_sq(values):
        # the sums are <v,v>, <g,g>, <v,g> per scope (amopt.optimize.split.am_momentum_sums)
        return math.fsum(values[1::3])

    return step, run | {"split": _Split(sums, apply, g_sq, on_device=True), "growth": ("am", lr)}


def _adam_options(options: dict) -> tuple[float, tuple[float, float], float, float]:
    """``lr``, ``betas``, ``eps`` and ``weight_decay`` of the Adam family, checked."""
    return (
        check_positive("lr", options["lr"]),
        check_betas("betas", options["betas"]),
        check_nonnegative("eps", options["eps"]),
        _weight_decay(options),
    )


def _adam(options: dict, *, decoupled: bool) -> tuple[Callable, dict]:
    lr, betas, eps, wd = _adam_options(options)
    # L2 decay (Adam) is coupled by _run, decoupled decay (AdamW) applied by the core
    hyper = {"lr": lr, "betas": betas, "eps": eps, "decoupled": decoupled}
    hyper["weight_decay"] = wd if decoupled else 0.0

    def step(xs, gs, f, state):
        state = _core.adam_init(xs) if state is None else state
        xs, state = _core.adam_step(xs, gs, state, **hyper)
        return xs, state, None

    return step, {"weight_decay": 0.0 if decoupled else wd}


def _am_adam(options: dict) -> tuple[Callable, dict]:
    config = AMConfig.from_options(options, beta_max=check_betas("betas", options["betas"])[0])
    # AM-Adam has the L2 penalty, coupled by _run; AM-AdamW decoupled or proximal decay,
    # applied by the core
    l2 = "weight_decay_mode" not in options
    mode = "decoupled" if l2 else check_weight_decay_mode(options["weight_decay_mode"])
    lr, betas, eps, wd = _adam_options(options)
    hyper = {"lr": lr, "betas": betas, "eps": eps, "weight_decay_mode": mode, "config": config}
    hyper["weight_decay"] = 0.0 if l2 else wd

    def step(xs, gs, f, state):
        state = _core.am_adam_init(xs) if state is None else state
        return _core.am_adam_step(xs, gs, state, f=f, **hyper)

    sums_hyper = {k: hyper[k] for k in ("lr", "betas", "eps", "weight_decay", "config")}
    apply_hyper = {k: hyper[k] for k in ("lr", "weight_decay", "weight_decay_mode", "config")}

    def sums(xs, gs, state):
        state = _split.am_adam_host_init(xs) if state is None else state
        return (state, *_split.am_adam_sums(xs, gs, state, **sums_hyper))

    def apply(xs, gs, f, state, pending, values):
        return _split.am_adam_apply(state, pending, values, f=f, **apply_hyper)

    run = {"is_am": True, "weight_decay": wd if l2 else 0.0}
    return step, run | {"split": _Split(sums, apply)}


# ----------------------------------------------------------------------------- methods


def _method(
    factory: Callable[[dict], tuple[Callable, dict]], loop: _Loop, **options: Any
) -> Callable[[Callable], Callable[..., OptimizeResult]]:
    """Make ``_minimize_<method>`` from a stand-in function that holds its name and docstring.

    The keyword arguments of the result are ``options`` and ``loop.options`` (name:
    default); the ``%(key)s`` of the docstring are replaced by the descriptions of
    ``_DOCS``. ``factory`` builds the step from the options.
    """
    options |= loop.options

    def make(stand_in: Callable) -> Callable[..., OptimizeResult]:
        name = stand_in.__name__.removeprefix("_minimize_").replace("_", "-")

        def minimize_method(fun, x0, args=(), jac=None, callback=None, **given) -> OptimizeResult:
            _check_unknown_options({k: v for k, v in given.items() if k not in options})
            opts = {k: given.get(k, default) for k, default in options.items()}
            counted, chosen = None, False
            if "lr" in opts and opts["lr"] is None and options["lr"] is None:
                # 1/L, from fun.L or estimated at x0 (amopt.optimize.step_size)
                from amopt.optimize.step_size import default_lr

                wd = _weight_decay(opts)
                lr, nfev, njev, how = default_lr(fun, x0, args, jac, weight_decay=wd)
                opts["lr"], counted = lr, (nfev, njev)
                chosen = how != "none"
            step, run = factory(opts)
            run["counted"] = counted
            if loop.always_sample is None:
                run["gtol"] = opts["gtol"]
            else:
                sampler = [opts[k] for k in ("batch_size", "seed", "replace", "gtol")]
                run.update(_sampling(fun, *sampler, always=loop.always_sample, method=name))
            run.setdefault("is_am", False)
            res = _run(fun, x0, args, jac, callback, step=step, maxiter=opts["maxiter"], **run)
            if chosen:
                res["lr"] = opts["lr"]  # the step size chosen, as the user did not
            if opts["disp"]:
                _display(res)
            return res

        # the signature of scipy's methods: the options are keyword arguments
        sig = inspect.signature(minimize_method)
        *scipy_args, rest = sig.parameters.values()
        keywords = [inspect.Parameter(k, rest.KEYWORD_ONLY, default=v) for k, v in options.items()]
        minimize_method.__signature__ = sig.replace(  # type: ignore[attr-defined]
            parameters=[*scipy_args, *keywords, rest.replace(name="unknown_options")]
        )
        minimize_method.__name__ = minimize_method.__qualname__ = stand_in.__name__
        if stand_in.__doc__ is not None:  # None under python -OO
            doc = stand_in.__doc__ % _DOCS
            # disp, an option of every method, closes its Options section
            head, sep, notes = doc.partition("\n    Notes\n")
            tail = sep + notes if sep else "    "
            doc = head.rstrip() + "\n    " + _DOCS["disp"] + "\n" + tail
            minimize_method.__doc__ = doc
        return minimize_method

    return make


@_method(_gd, _FULL_BATCH, lr=None, weight_decay=0.0)
def _minimize_gd():
    r"""Gradient descent, :math:`x_{t+1} = x_t - \eta \nabla f(x_t)`.

    Options
    -------
    %(lr)s
    %(weight_decay)s
    %(full_batch)s
    """


@_method(_heavy_ball, _FULL_BATCH, lr=None, beta=0.9, weight_decay=0.0)
def _minimize_mgd():
    r"""Damped momentum (MGD): an average of the gradients, no faster than GD at ``lr = 1/L``.

    .. math::

        d_0 = g_0,\quad d_{t+1} = \beta d_t + (1-\beta) g_t,\quad x_{t+1} = x_t - \eta d_{t+1}

    This is ``torch.optim.SGD(momentum=beta, dampening=beta)``, the momentum the
    AM methods adapt. The step along a constant gradient is :math:`\eta g`: it does
    not accelerate. The classical heavy ball, ``SGD(momentum=beta)``, is
    ``"heavy-ball"``; Nesterov's is ``"nesterov"``.

    Options
    -------
    %(lr)s
    beta : float
        Momentum coefficient in [0, 1].
    %(weight_decay)s
    %(full_batch)s
    """


@_method(partial(_classical, nesterov=False), _FULL_BATCH, lr=None, beta=0.9, weight_decay=0.0)
def _minimize_heavy_ball():
    r"""Polyak's heavy ball: classical, undamped momentum (``torch.optim.SGD(momentum=beta)``).

    .. math::

        d_0 = 0,\quad d_{t+1} = \beta d_t + g_t,\quad x_{t+1} = x_t - \eta d_{t+1},
        \quad\text{i.e.}\quad x_{t+1} = x_t - \eta g_t + \beta (x_t - x_{t-1})

    Unlike ``"mgd"`` (damped, :math:`d = \beta d + (1-\beta) g`, which at
    ``lr = 1/L`` is no faster than gradient descent), the momentum adds up
    :math:`1/(1-\beta)` gradients. Textbook tuning on an :math:`L`-smooth,
    :math:`\mu`-strongly convex quadratic: :math:`\eta = 4/(\sqrt L + \sqrt\mu)^2`,
    :math:`\beta = ((\sqrt\kappa-1)/(\sqrt\kappa+1))^2`, rate
    :math:`(\sqrt\kappa-1)/(\sqrt\kappa+1)` per step (:math:`\kappa = L/\mu`).

    Options
    -------
    %(lr)s
    beta : float
        Momentum coefficient in [0, 1] (default 0.9, torch's usual value).
    %(weight_decay)s
    %(full_batch)s
    """


@_method(partial(_classical, nesterov=True), _FULL_BATCH, lr=None, beta=0.9, weight_decay=0.0)
def _minimize_nesterov():
    r"""Nesterov momentum, as ``torch.optim.SGD(momentum=beta, nesterov=True)`` (undamped).

    .. math::

        d_0 = 0,\quad d_{t+1} = \beta d_t + g_t,\quad
        x_{t+1} = x_t - \eta\,(g_t + \beta d_{t+1})

    Textbook tuning on an :math:`L`-smooth, :math:`\mu`-strongly convex objective:
    :math:`\eta = 1/L`, :math:`\beta = (\sqrt\kappa-1)/(\sqrt\kappa+1)`
    (:math:`\kappa = L/\mu`).

    Options
    -------
    %(lr)s
    beta : float
        Momentum coefficient in [0, 1] (default 0.9).
    %(weight_decay)s
    %(full_batch)s
    """


@_method(_am_momentum, _FULL_BATCH, lr=None, weight_decay=0.0, **_AM_MGD)
def _minimize_am_mgd():
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
    %(lr)s
    %(weight_decay)s
    lam : float
        Proximal regularisation :math:`\lambda \ge 0`.
    beta_max : float or None
        Upper bound of :math:`\beta_t`, in [0, 1]. None (default): 0.998 with
        the linear numerator, 1 with the exact one (the paper's Algorithm 1). A
        cap of 1 lets the linear rule keep :math:`\beta_t \approx 0.9999` on
        ill-conditioned problems, where :math:`d` then barely takes in new
        gradients and the iterates fall behind GD's; 0.998 is ahead of GD on
        every convex problem of the measured set (docs/choosing-a-method.md).
    numerator : {"linear", "exact"}
        ``"linear"`` (default): the linearised numerator
        :math:`(1+\lambda)\|g\|^2 - \lambda\|d-g\|^2`. ``"exact"``: the
        paper's Algorithm 1, the decrease of the objective in the formula above
        (needs f values; with ``weight_decay``, of :math:`F`). The exact rule
        crawls near the optimum of well-conditioned problems (its beta tends to 1
        and the gap falls like :math:`1/t`); on the measured problem set
        (docs/choosing-a-method.md) the linear one reaches every gradient test
        GD reaches, in fewer iterations.
    per_layer : bool
        With a list of arrays as ``x0``: one beta per array instead of one global beta.
    variant : {None, "clip", "restart"}
        ``"clip"``: :math:`\max(\beta_t, \beta_{\min})`; ``"restart"``:
        ``beta_high`` if :math:`\beta_t \ge \theta` else ``beta_low``.
    beta_min, theta, beta_high, beta_low : float
        Variant parameters, in [0, 1].
    %(full_batch)s
    """


@_method(_gd, _MINI_BATCH, lr=None, weight_decay=0.0)
def _minimize_sgd():
    r"""Stochastic gradient descent on a :class:`~amopt.FiniteSum`.

    Options
    -------
    %(lr)s
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
    ``fun`` must be a :class:`~amopt.FiniteSum`: a plain callable is refused
    with a ``ValueError`` (use ``"gd"`` for full-batch steps).
    """


@_method(_heavy_ball, _MINI_BATCH, lr=None, beta=0.9, weight_decay=0.0)
def _minimize_msgd():
    r"""Stochastic damped momentum (MSGD): ``"mgd"`` on mini-batches.

    Options
    -------
    lr, beta, weight_decay
        As for ``"mgd"``.
    maxiter, batch_size, seed, replace, gtol
        As for ``"sgd"``.
    """


@_method(_am_momentum, _MINI_BATCH, lr=None, weight_decay=0.0, **_AM_STOCHASTIC)
def _minimize_am_sgd():
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


@_method(partial(_adam, decoupled=False), _OPTIONAL_BATCH, **_ADAM, weight_decay=0.0)
def _minimize_adam():
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


@_method(partial(_adam, decoupled=True), _OPTIONAL_BATCH, **_ADAM, weight_decay=1e-2)
def _minimize_adamw():
    r"""AdamW, exactly as ``torch.optim.AdamW`` (decoupled weight decay).

    Options
    -------
    lr, betas, eps, maxiter, batch_size, seed, replace
        As for ``"adam"``.
    weight_decay : float
        Decoupled weight decay :math:`\mu \ge 0`: :math:`x \leftarrow (1 - \eta\mu) x`
        before the step.
        %(decoupled)s
    gtol : float
        Stop when :math:`\max|\nabla f| \le` ``gtol`` (the mini-batch gradient with
        ``batch_size``); default 1e-5 full batch, 0 (off) with ``batch_size``.
    """


@_method(_am_adam, _OPTIONAL_BATCH, **_ADAM, weight_decay=0.0, **_AM_ADAM)
def _minimize_am_adam():
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


@_method(
    _am_adam,
    _OPTIONAL_BATCH,
    **_ADAM,
    weight_decay=1e-2,
    weight_decay_mode="decoupled",
    **_AM_ADAM,
)
def _minimize_am_adamw():
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
        %(decoupled)s
    weight_decay_mode : {"decoupled", "proximal"}
        How the decay is applied.
    lr, betas, eps, lam, numerator, per_layer, variant, beta_min, theta, beta_high, beta_low
        As for ``"am-adam"``.
    gtol : float
        As for ``"adamw"``.
    maxiter, batch_size, seed, replace
        As for ``"adam"``.
    """


METHODS: dict[str, Callable[..., OptimizeResult]] = {
    "gd": _minimize_gd,
    "mgd": _minimize_mgd,
    "heavy-ball": _minimize_heavy_ball,
    "nesterov": _minimize_nesterov,
    "am-mgd": _minimize_am_mgd,
    "adam": _minimize_adam,
    "adamw": _minimize_adamw,
    "am-adam": _minimize_am_adam,
    "am-adamw": _minimize_am_adamw,
    "sgd": _minimize_sgd,
    "msgd": _minimize_msgd,
    "am-sgd": _minimize_am_sgd,
}
