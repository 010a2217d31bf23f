"""The AM steps cut at the rule, for the device loop of :func:`amopt.minimize`.

On a device every value the loop tests is read in one transfer per iteration
(:func:`amopt.backends.device.read`); so that the rule's sums travel in that transfer too,
the AM steps of :mod:`amopt.optimize.steps` are cut in two here: ``*_sums`` queues the
sums of a step, ``*_apply`` runs the rule on their host values (on NumPy float64, or as
the rule's tape in Python floats: the same IEEE operations as on the device) and applies
its coefficients as Python numbers, rounded to the arrays' dtype as a 0-d array of that
dtype would hold them. Given the sums' arrays themselves (the pipelined loop), the apply
runs the rule on the device instead, as one generated kernel where the library has one
(:func:`amopt.backends.kernel`). The values are those of the uncut steps.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from amopt import backends
from amopt.backends import plain_namespace
from amopt.core import rule as _rule
from amopt.core import tape as _tape
from amopt.core.config import AMConfig
from amopt.core.reduce import Array, accumulation_dtype, as_tuple, cast, restore, scopes
from amopt.core.xp import array_namespace
from amopt.optimize.steps import (
    AMAdamState,
    AMState,
    _adam_x,
    _first_step,
    _narrow,
    _widen,
    adam_init,
)

__all__ = [
    "am_adam_apply",
    "am_adam_host_init",
    "am_adam_sums",
    "am_momentum_apply",
    "am_momentum_sums",
]


def _host_scalar(xp: Any, value: Any, dtype: Any) -> float:
    """``value`` rounded to ``dtype`` (a float of the namespace ``xp``), as a Python float."""
    value = float(value)
    if dtype == xp.float64:
        return value
    if dtype == xp.float32:
        return float(np.float32(value))
    if dtype == getattr(xp, "float16", None):
        return float(np.float16(value))
    if dtype == getattr(xp, "bfloat16", None):
        # round to nearest even on the top 16 bits of the float32
        bits = int(np.array(value, dtype=np.float32).view(np.uint32))
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return float(np.array(bits, dtype=np.uint32).view(np.float32))
    return value


def _flat(xp: Any, a: Array) -> Array:
    return a if a.ndim == 1 else xp.reshape(a, (-1,))


class _HostScalars:
    """The few functions of the rule (:mod:`amopt.core.rule`) on NumPy float64 scalars.

    One scope's rule on the host is a few dozen operations on single numbers; on 0-d
    NumPy arrays each costs about a microsecond of dispatch, on NumPy scalars a small
    part of that, with the same IEEE results (``where`` picks, ``clip`` compares as
    ``np.clip`` does, NaN passing through; ``tests/test_one_rule.py`` compares them bit
    for bit).
    """

    finfo = staticmethod(np.finfo)
    isnan = staticmethod(np.isnan)

    @staticmethod
    def where(cond: Any, a: Any, b: Any) -> Any:
        out = a if cond else b
        return out if isinstance(out, np.generic) else np.float64(out)

    @staticmethod
    def ones_like(a: Any) -> Any:
        return a.dtype.type(1)

    @staticmethod
    def zeros_like(a: Any) -> Any:
        return a.dtype.type(0)

    @staticmethod
    def full_like(a: Any, value: float) -> Any:
        return a.dtype.type(value)

    @staticmethod
    def clip(a: Any, lo: float | None, hi: float | None) -> Any:
        if lo is not None and a < lo:
            return a.dtype.type(lo)
        if hi is not None and a > hi:
            return a.dtype.type(hi)
        return a


def _host_rule(rule: Any, sums: Any, k: int, config: AMConfig, **kwargs: Any) -> Any:
    """``rule`` on the host: ``sums`` (read floats, ``k`` per scope) as float64 NumPy values.

    One scope runs as the rule's tape in Python floats (:func:`amopt.core.tape.python_rule`:
    the same IEEE operations bit for bit, about a twentieth of NumPy's cost per
    operation on scalars), or on NumPy scalars (:class:`_HostScalars`) where the rule
    cannot be recorded; several on an array with ``numpy`` itself as the namespace
    (NumPy's own functions, without the compat layer's wrappers). This runs once per
    iteration of the device loop. The outputs are arrays with one entry per scope.
    """
    if len(sums) == k:
        fn, values = _one_scope_tape(rule, k, config, kwargs), None
        if fn is not None:
            values = [float(v) for v in sums]
            f_decrease = kwargs.get("f_decrease")
            if f_decrease is not None:
                values.append(float(f_decrease))
            out = fn(values)
            if len(out) == 1:
                return np.array(out, dtype=np.float64)
            return tuple(np.array((o,), dtype=np.float64) for o in out)
    host = np.asarray(sums, dtype=np.float64).reshape(-1, k)
    with np.errstate(all="ignore"):  # a NaN from overflowing sums is the rule's to handle
        if host.shape[0] != 1:
            return rule(np, host, config, **kwargs)
        out = rule(_HostScalars, host[0], config, **kwargs)
    if isinstance(out, tuple):
        return tuple(np.asarray(o).reshape(1) for o in out)
    return np.asarray(out).reshape(1)


def _rule_of_sums(xp: Any, sums: Any, base: Any, cfg: Any, k: int, **kwargs: Any) -> Any:
    """``base`` with ``f_decrease`` the ``k``-th input: a tape of one scope's rule that
    takes the decrease of f as an input, not as a recorded constant."""
    return base(xp, sums, cfg, f_decrease=sums[..., k], **kwargs)


#: (rule, config, k, exact, keywords, tape) of the last one-scope host rule: the device
#: loop calls with the same ones every iteration. One tuple, rebound whole.
_last_tape: tuple[Any, ...] = (None, None, None, None, None, None)


def _one_scope_tape(rule: Any, k: int, config: AMConfig, kwargs: dict) -> Any:
    """The tape of ``rule`` for one scope of ``k`` sums (plus ``f_decrease`` as input
    ``k`` when given) as a Python function, or None where it cannot be recorded."""
    global _last_tape
    exact = kwargs.get("f_decrease") is not None
    rest = {name: value for name, value in kwargs.items() if name != "f_decrease"}
    last = _last_tape
    if last[0] is rule and last[1] is config and last[2] == k and last[3] == exact:
        if last[4] == rest:
            return last[5]
    if exact:
        fn = _tape.python_rule(_rule_of_sums, k + 1, base=rule, cfg=config, k=k, **rest)
    else:
        fn = _tape.python_rule(rule, k, cfg=config, **rest)
    _last_tape = (rule, config, k, exact, rest, fn)
    return fn


def _exact(numerator: str, f_prev: Any) -> bool:
    return numerator == "exact" and not (isinstance(f_prev, float) and math.isnan(f_prev))


def am_momentum_sums(
    params: Any, grads: Any, state: AMState, *, config: AMConfig
) -> tuple[Any, list[Array]]:
    r"""The device half of :func:`am_momentum_step` before the rule: its sums.

    Returns ``(pending, sums)``: what :func:`am_momentum_apply` needs again, and per
    scope, in scope order, the 0-d arrays :math:`\langle v,v\rangle`,
    :math:`\langle g,g\rangle` and :math:`\langle v,g\rangle` (:math:`v = d - g`).
    Each is one ``@`` of two flattened arrays (a BLAS dot on the device; the
    operator, without the namespace's wrapper); :func:`am_momentum_apply` forms the
    rule's :data:`amopt.core.rule.MOMENTUM_SUMS` from them on the host.
    """
    xs, _ = as_tuple(params)
    gs, _ = as_tuple(grads)
    xp = array_namespace(*xs, *gs)
    ds = gs if state.step == 0 and state.d_from_g else state.d
    exact = _exact(config.numerator, state.f_prev)
    sums: list[Array] = []
    diffs: list[Array] = [None] * len(xs)
    for scope in scopes(len(xs), config.per_layer):
        acc = accumulation_dtype(xp, [gs[i] for i in scope])
        cols: list[Array] = []
        for i in scope:
            g = _flat(xp, cast(xp, gs[i], acc))
            d = _flat(xp, cast(xp, ds[i], acc))
            v = d - g
            if acc == gs[i].dtype:
                diffs[i] = v if v.shape == gs[i].shape else xp.reshape(v, gs[i].shape)
            # three reads of v and g: <d,d> and <v,d> follow on the host
            part = [v @ v, g @ g, v @ g]
            cols = part if not cols else [a + b for a, b in zip(cols, part, strict=True)]
        sums += cols
    return (ds, diffs, exact, xp), sums


def _momentum_sums_of(read: list[float], exact: bool) -> list[float]:
    r""":data:`amopt.core.rule.MOMENTUM_SUMS` from :func:`am_momentum_sums`'s values.

    With :math:`d = v + g`: :math:`\langle v,d\rangle = \langle v,v\rangle +
    \langle v,g\rangle` and :math:`\langle d,d\rangle = \langle v,v\rangle +
    2\langle v,g\rangle + \langle g,g\rangle`, each within the rounding error that
    a dot of its own would have (:math:`\epsilon \|v\|(\|v\| + \|g\|)`, resp. of
    the order of :math:`\epsilon(\|d\|^2 + \|g\|^2)`, which only the rule's
    threshold :math:`\epsilon^2(\langle d,d\rangle + \langle g,g\rangle)` reads).
    """
    out: list[float] = []
    for k in range(0, len(read), 3):
        vv, gg, vg = (float(a) for a in read[k : k + 3])
        dd = vv + 2.0 * vg + gg
        out += [vv, gg, dd, vg, vv + vg] if exact else [vv, gg, dd]
    return out


def am_momentum_apply(
    params: Any,
    grads: Any,
    state: AMState,
    pending: Any,
    sums: list,
    *,
    lr: float,
    f: Any,
    config: AMConfig,
) -> tuple[Any, AMState, Any]:
    """The rest of :func:`am_momentum_step`: the rule on the ``sums``, then the apply.

    ``sums`` are the values of :func:`am_momentum_sums`'s arrays (host floats; ``f`` the
    host value of the objective) or those arrays themselves (the rule then runs on the
    device, in float64, on the same values; ``f`` a 0-d array there). Returns what
    :func:`am_momentum_step` returns, with host betas or 0-d device betas.

    On CuPy arrays, and on torch CUDA tensors with the rule on the device, the rule and
    the apply each run as one generated kernel (``momentum_rule`` and ``momentum_apply``
    of :func:`amopt.backends.kernel`) with the values of the array operations below, bit
    for bit; a kernel that declines leaves them to those operations.
    """
    xs, single = as_tuple(params)
    gs, _ = as_tuple(grads)
    ds, diffs, exact, xp = pending
    on_device = bool(sums) and not isinstance(sums[0], float | np.generic)
    if on_device:
        if f is not None and f.dtype != xp.float64:
            f = xp.astype(f, xp.float64)
        f_decrease = state.f_prev - f if exact else None
        rule_xp = plain_namespace(xp)
        # one kernel from the rule's tape (CuPy's; Triton's for torch CUDA tensors)
        rule_kernel = backends.kernel(backends.library_of(rule_xp), "momentum_rule")
        fused = rule_kernel and rule_kernel(_rule.momentum_beta, sums, config, lr, f_decrease)
        if fused is not None:
            beta, gamma = fused
        else:
            dots = cast(rule_xp, rule_xp.reshape(rule_xp.stack(sums), (-1, 3)), rule_xp.float64)
            beta, gamma = _rule.momentum_beta_of_dots(
                rule_xp,
                dots,
                config,
                base=_rule.momentum_beta,
                lr=lr,
                exact=exact,
                f_decrease=f_decrease,
            )
        f_next = f
    else:
        f_decrease = state.f_prev - f if exact else None
        beta, gamma = _host_rule(
            _rule.momentum_beta,
            _momentum_sums_of(sums, exact),
            5 if exact else 3,
            config,
            lr=lr,
            f_decrease=f_decrease,
        )
        f_next = float(f)
    new_d: list[Array] = list(ds)
    new_x: list[Array] = list(xs)
    # one kernel for d and x: CuPy's, or Triton's for torch tensors on CUDA with the
    # device rule's gamma (a host gamma it declines)
    fused_apply = backends.kernel(backends.library_of(xs[0]), "momentum_apply")
    for k, scope in enumerate(scopes(len(xs), config.per_layer)):
        for i in scope:
            if on_device:
                coef = cast(xp, gamma[k], gs[i].dtype)
            else:
                coef = _host_scalar(xp, gamma[k], gs[i].dtype)
            # d = g + coef*(d - g) rather than the convex-combination form: exact when d = g.
            # d - g is the sums' own where they were formed in the arrays' dtype.
            fused = None
            if fused_apply is not None:
                w, with_v = (ds[i], False) if diffs[i] is None else (diffs[i], True)
                fused = fused_apply(xs[i], gs[i], w, coef, lr, with_v)
            if fused is None:
                v = ds[i] - gs[i] if diffs[i] is None else diffs[i]
                new_d[i] = gs[i] + coef * v
                new_x[i] = xs[i] - lr * new_d[i]
            else:
                new_d[i], new_x[i] = fused
    new_state = AMState(state.step + 1, tuple(new_d), f_next, state.d_from_g)
    if on_device:
        betas = tuple(beta[k] for k in range(beta.shape[0]))
    else:
        betas = tuple(np.float64(b) for b in beta.reshape(-1))
    return restore(tuple(new_x), single), new_state, (betas if config.per_layer else betas[0])


def am_adam_host_init(params: Any) -> AMAdamState:
    """:func:`am_adam_init` with the running products of the betas held on the host."""
    xs, _ = as_tuple(params)
    base = adam_init(params)
    return AMAdamState(0, base.exp_avg, base.exp_avg_sq, (np.float64(1.0),) * len(xs), math.nan)


def am_adam_sums(
    params: Any,
    grads: Any,
    state: AMAdamState,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    config: AMConfig,
) -> tuple[Any, list[Array]]:
    """The device half of :func:`am_adam_step` before the rule, for a state whose
    ``beta1_prod`` are host numbers (:func:`am_adam_host_init`).

    Returns ``(pending, sums)``: what :func:`am_adam_apply` needs again, and, per
    array, the sums of the numerator's terms of nonzero weight
    (:data:`amopt.core.rule.ADAM_TERMS` or :data:`amopt.core.rule.ADAM_EXACT_TERMS`), of
    ``w (d-g)^2``, ``w d^2`` and ``w g^2``, each one ``@`` of two flattened arrays
    in the accumulation dtype; :func:`am_adam_apply` weighs and adds them into the
    rule's :data:`amopt.core.rule.ADAM_SUMS` on the host.
    """
    xs0, _ = as_tuple(params)
    gs, _ = as_tuple(grads)
    xp = array_namespace(*xs0, *gs)
    xs, gs = _widen(xp, xs0, xs0), _widen(xp, gs, xs0)
    ds, vs = _widen(xp, state.exp_avg, xs0), _widen(xp, state.exp_avg_sq, xs0)
    beta2, lam = betas[1], config.lam
    t = state.step + 1
    exact = _exact(config.numerator, state.f_prev)
    weights = _rule.adam_weights(config, lr=lr, weight_decay=weight_decay, exact=exact)
    vs = tuple(beta2 * v + (1.0 - beta2) * (g * g) for v, g in zip(vs, gs, strict=True))
    bias2 = 1.0 - beta2**t
    n = len(xs)
    ps, lps, denoms, diffs = [None] * n, [None] * n, [None] * n, [None] * n
    sums: list[Array] = []
    for scope in scopes(n, config.per_layer):
        c = _rule.adam_correction(state.beta1_prod[scope[0]], config)
        for i in scope:
            p = _host_scalar(xp, c, vs[i].dtype) * (eps + xp.sqrt(vs[i] / bias2))
            lp = lam * p
            denom = 1.0 + lp
            ps[i], lps[i], denoms[i] = p, lp, denom
            acc = accumulation_dtype(xp, [gs[i]])
            g, d, x = (_flat(xp, cast(xp, a, acc)) for a in (gs[i], ds[i], xs[i]))
            p_a, denom_a = (_flat(xp, cast(xp, a, acc)) for a in (p, denom))
            u = 1.0 / denom_a
            w = u / p_a
            v = d - g
            if acc == gs[i].dtype:
                diffs[i] = xp.reshape(v, gs[i].shape)  # the apply's d - g, the same values
            wv = w * v
            if exact:
                uv = u * v
                terms = [(wv, g), (uv, d), (x, v)]
            else:
                q = g / p_a
                uv = u * v if weights[1] != 0 else None
                terms = [(q, g), (uv, v), (q, d), (g, x), (d, x)]
            sums += [a @ b for (a, b), a_k in zip(terms, weights, strict=True) if a_k != 0]
            sums += [wv @ v, (w * d) @ d, (w * g) @ g]
    pending = (xs0, xs, gs, ds, vs, (ps, lps, denoms, diffs), weights, xp)
    return pending, sums


def am_adam_apply(
    state: AMAdamState,
    pending: Any,
    sums: list[float],
    *,
    lr: float,
    weight_decay: float = 0.0,
    weight_decay_mode: str = "decoupled",
    f: Any,
    config: AMConfig,
) -> tuple[Any, AMAdamState, Any]:
    """The rest of :func:`am_adam_step`: the rule on the host ``sums``, then the apply."""
    xs0, xs, gs, ds, vs, (ps, lps, denoms, diffs), weights, xp = pending
    wd = weight_decay
    scope_list = scopes(len(xs), config.per_layer)
    # the rule's N, D, ref per scope: the weighted term sums, added array by array
    values = iter(sums)
    nonzero = [a_k for a_k in weights if a_k != 0]
    rows = []
    for scope in scope_list:
        row_k = None
        for _ in scope:
            terms = [next(values) for _ in nonzero]
            num = nonzero[0] * terms[0] if nonzero else 0.0
            for a_k, term in zip(nonzero[1:], terms[1:], strict=True):
                num = num + a_k * term
            den, wdd, wgg = next(values), next(values), next(values)
            part = [num, den, wdd + wgg]
            row_k = part if row_k is None else [a + b for a, b in zip(row_k, part, strict=True)]
        rows += row_k
    exact = len(weights) == 3
    f_decrease = state.f_prev - f if exact else None
    beta = _host_rule(
        _rule.adam_beta,
        rows,
        3,
        config,
        lr=lr,
        weight_decay=wd,
        f_decrease=f_decrease,
        first=_first_step(state.step),
    )
    beta = np.reshape(beta, (-1,))
    new_d, new_x = list(ds), list(xs)
    new_prods = list(state.beta1_prod)
    for k, scope in enumerate(scope_list):
        for i in scope:
            g, d, x, p = gs[i], ds[i], xs[i], ps[i]
            b = _host_scalar(xp, beta[k], g.dtype)
            v = diffs[i] if diffs[i] is not None else d - g
            d = g + (b + lps[i]) / denoms[i] * v
            new_d[i], new_x[i] = d, _adam_x(x, d, p, lr, wd, weight_decay_mode)
            new_prods[i] = state.beta1_prod[scope[0]] * beta[k]
    new_state = AMAdamState(
        state.step + 1,
        _narrow(xp, tuple(new_d), xs0),
        _narrow(xp, vs, xs0),
        tuple(new_prods),
        float(f),
    )
    betas_out = tuple(np.float64(b) for b in beta)
    beta_ret = betas_out if config.per_layer else betas_out[0]
    return restore(_narrow(xp, tuple(new_x), xs0), False), new_state, beta_ret
