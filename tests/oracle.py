"""Test oracle: a literal NumPy transcription of ``docs/algorithms.md``.

This module is the independent reference against which every surface of
``amopt`` is checked, step by step, at a relative tolerance of about 1e-12.
It follows the rules of ``algorithms.md`` (sections 2, 3, 4 and 5) line by
line, with explicit Python loops over the list of parameter arrays, and it
deliberately shares no code with ``amopt`` (it never imports it).

Conventions
-----------
* Parameters are a Python list of NumPy arrays of any shapes; every input is
  copied to float64.
* ``oracle(x_list, t)`` returns ``(f, g_list)``: the objective value (possibly a
  mini-batch value) and the gradient list at ``x_list`` for the 0-based step
  index ``t``.
* Beta scope: ``per_layer=False`` gives one beta for all arrays (inner products
  summed over every array), ``per_layer=True`` one beta per array.
* ``tiny = eps(float64)**2`` is the zero-denominator threshold of step 4.

Every ``run_*`` function returns a dict with ``"x"`` (the iterates
``x_0 .. x_T`` as copies), ``"d"`` (the final momentum buffer, ``exp_avg`` for
the Adam family) and, for the AM methods, ``"betas"``: the beta actually
applied on each step (after guard, clipping and variant), of shape
``(n_steps,)`` for a global scope or ``(n_steps, n_arrays)`` per layer.
"""

import numpy as np

tiny = np.finfo(np.float64).eps ** 2

__all__ = [
    "am_beta",
    "run_adam",
    "run_am_adam",
    "run_am_mgd",
    "run_gd",
    "run_mgd",
    "tiny",
]


def _copy(arrays):
    return [np.array(a, dtype=np.float64, copy=True) for a in arrays]


def _evaluate(oracle, x, t):
    f, g = oracle(_copy(x), t)
    return float(f), _copy(g)


def _scopes(n_arrays, per_layer):
    """Index lists of the arrays in each beta scope."""
    if per_layer:
        return [[i] for i in range(n_arrays)]
    return [list(range(n_arrays))]


def _apply_variant(beta, variant, beta_min, theta, beta_high, beta_low):
    """Section 4, applied to the guarded and clipped AM beta."""
    if variant is None:
        return beta
    if variant == "clip":
        return max(beta, beta_min)
    if variant == "restart":
        return beta_high if beta >= theta else beta_low
    raise ValueError(f"unknown variant {variant!r}")


def _lr_at(lr, t):
    """The learning rate of step ``t``: ``lr`` itself, or ``lr[t]`` for a schedule."""
    if np.ndim(lr) == 0:
        return float(lr)
    return float(lr[t])


def _lr_ratio(lr, t):
    """``r = lr_{t-1} / lr_t`` (sections 2 and 3): 1 on the first step and where lr_t = 0."""
    if t == 0 or _lr_at(lr, t) == 0:
        return 1.0
    return _lr_at(lr, t - 1) / _lr_at(lr, t)


def _betas_array(betas, per_layer, n_arrays):
    """Stack the per-step lists of scope betas into the documented shape."""
    if per_layer:
        return np.array(betas, dtype=np.float64).reshape(len(betas), n_arrays)
    return np.array(betas, dtype=np.float64).reshape(len(betas))


def am_beta(num, den, dd, gg, beta_max):
    """Step 4 of section 2: guard, then ``clip(num / den, 0, beta_max)``.

    Parameters
    ----------
    num, den : float
        Numerator and denominator of the beta rule (summed over the scope).
    dd, gg : float
        ``<d, d>`` and ``<g, g>`` (or their weighted versions for AM-Adam),
        summed over the same scope; they set the zero-denominator threshold.
    beta_max : float
        Upper clipping bound.

    Returns
    -------
    float
        ``0`` when ``den <= tiny * (dd + gg)``, else the clipped ratio.
    """
    if den <= tiny * (dd + gg):
        return 0.0
    return float(np.clip(num / den, 0.0, beta_max))


def run_gd(oracle, x0, *, lr, n_steps, weight_decay=0.0):
    """Gradient descent, section 5: ``x -= lr * g`` (coupled weight decay)."""
    x = _copy(x0)
    xs = [_copy(x)]
    for t in range(n_steps):
        _, g = _evaluate(oracle, x, t)
        for i in range(len(x)):
            g[i] = g[i] + weight_decay * x[i]
        for i in range(len(x)):
            x[i] = x[i] - lr * g[i]
        xs.append(_copy(x))
    return {"x": xs}


def run_mgd(oracle, x0, *, lr, beta, n_steps, weight_decay=0.0):
    """Damped heavy ball, section 5.

    ``d = g`` on step 0, then ``d = beta * d + (1 - beta) * g``; ``x -= lr * d``.
    """
    x = _copy(x0)
    xs = [_copy(x)]
    d = None
    for t in range(n_steps):
        _, g = _evaluate(oracle, x, t)
        for i in range(len(x)):
            g[i] = g[i] + weight_decay * x[i]
        if t == 0:
            d = _copy(g)
        else:
            for i in range(len(x)):
                d[i] = beta * d[i] + (1 - beta) * g[i]
        for i in range(len(x)):
            x[i] = x[i] - lr * d[i]
        xs.append(_copy(x))
    return {"x": xs, "d": d}


def run_am_mgd(
    oracle,
    x0,
    *,
    lr,
    n_steps,
    lam=0.0,
    beta_max=1.0,
    numerator="exact",
    per_layer=False,
    variant=None,
    beta_min=0.5,
    theta=0.7,
    beta_high=0.9,
    beta_low=0.1,
    weight_decay=0.0,
    d0=None,
):
    """AM-MGD / AM-MSGD, section 2 (variants of section 4).

    ``numerator`` is ``"exact"`` (needs f values; the first step, which has no
    ``f_prev``, uses the linearised numerator) or ``"linear"``. When ``d0`` is
    given it is the initial ``d`` and step 0 does not set ``d = g``. ``lr`` is a
    number or a schedule (``lr[t]`` for step t); the linearised numerator then takes
    ``r = lr[t-1] / lr[t]`` (section 2 step 3).
    """
    if numerator not in ("exact", "linear"):
        raise ValueError(f"unknown numerator {numerator!r}")
    x = _copy(x0)
    xs = [_copy(x)]
    n = len(x)
    scopes = _scopes(n, per_layer)
    d = None if d0 is None else _copy(d0)
    f_prev = None
    betas = []
    for t in range(n_steps):
        # step 1
        f, g = _evaluate(oracle, x, t)
        lr_t = _lr_at(lr, t)
        r = _lr_ratio(lr, t)
        for i in range(n):
            g[i] = g[i] + weight_decay * x[i]
        if t == 0 and d0 is None:
            d = _copy(g)

        # step 2
        v = [d[i] - g[i] for i in range(n)]

        step_betas = []
        for scope in scopes:
            den = 0.0
            dd = 0.0
            gg = 0.0
            vg = 0.0
            gd = 0.0
            for i in scope:
                den += np.sum(v[i] * v[i])
                dd += np.sum(d[i] * d[i])
                gg += np.sum(g[i] * g[i])
                vg += np.sum(v[i] * (g[i] + lam * d[i]))
                gd += np.sum(g[i] * d[i])

            # step 3
            if numerator == "exact" and f_prev is not None:
                num = (f_prev - f) * (1 + lam) / lr_t - vg
            elif r == 1.0:
                num = (1 + lam) * gg - lam * den
            else:  # the general form, with the previous step's learning rate
                num = (1 + lam) * r * gd - vg

            # step 4, then the variant
            beta = am_beta(num, den, dd, gg, beta_max)
            beta = _apply_variant(beta, variant, beta_min, theta, beta_high, beta_low)
            step_betas.append(beta)

            # step 5
            for i in scope:
                d[i] = g[i] + (beta + lam) / (1 + lam) * (d[i] - g[i])

        # step 6
        for i in range(n):
            x[i] = x[i] - lr_t * d[i]
        f_prev = f
        xs.append(_copy(x))
        betas.append(step_betas)
    return {"x": xs, "betas": _betas_array(betas, per_layer, n), "d": d}


def run_adam(
    oracle,
    x0,
    *,
    lr,
    n_steps,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    decoupled=False,
):
    """``torch.optim.Adam`` (``decoupled=False``) or ``torch.optim.AdamW``.

    Written in the order of operations of torch's ``_single_tensor_adam`` so
    that it matches torch in float64 to about 1e-15.
    """
    beta1, beta2 = betas
    x = _copy(x0)
    xs = [_copy(x)]
    n = len(x)
    m = [np.zeros_like(x[i]) for i in range(n)]
    v = [np.zeros_like(x[i]) for i in range(n)]
    for t in range(n_steps):
        _, g = _evaluate(oracle, x, t)
        step = float(t + 1)
        for i in range(n):
            if weight_decay != 0:
                if decoupled:
                    x[i] = x[i] * (1 - lr * weight_decay)
                else:
                    g[i] = g[i] + weight_decay * x[i]

            # exp_avg.lerp_(grad, 1 - beta1); torch's lerp switches formula at 0.5
            weight = 1 - beta1
            if abs(weight) < 0.5:
                m[i] = m[i] + weight * (g[i] - m[i])
            else:
                m[i] = g[i] - (g[i] - m[i]) * (1 - weight)
            # exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            v[i] = v[i] * beta2 + ((1 - beta2) * g[i]) * g[i]

            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            step_size = lr / bias_correction1
            bias_correction2_sqrt = bias_correction2**0.5
            denom = np.sqrt(v[i]) / bias_correction2_sqrt + eps
            # param.addcdiv_(exp_avg, denom, value=-step_size)
            x[i] = x[i] + (-step_size * m[i]) / denom
        xs.append(_copy(x))
    return {"x": xs, "d": m}


def _adam_beta_condition(
    g, d, x, p, u, w, scope, N, D, lam, wd, lr, f, f_prev, numerator, beta_max
):
    """First-order size of the change of ``N / D`` per unit of input error (for tolerances).

    Not part of the rules. If every entry of ``g``, ``d`` and ``x`` (all arrays of the
    step) carries an absolute error of at most ``delta * scale``, where ``scale`` is the
    largest magnitude among them, and ``f``, ``f_prev`` a relative error ``delta``, then
    ``N / D`` moves by at most about ``delta`` times the returned value: the partial
    derivatives of ``N`` and ``D`` in absolute value, ``|dN| / D + |N / D| |dD| / D``.
    An absolute input error is the right model: a gradient formed as a sum of terms
    keeps an error of the size of its terms when it is itself small, and ``d - g``
    cancels when ``d`` is close to ``g``. A ratio clipped to ``[0, beta_max]`` with a
    margin of more than 1e-6 of the bound (far above any rounding) does not move: 0.
    """
    scale = max(float(np.max(np.abs(a), initial=0.0)) for a in (*g, *d, *x))
    exact = numerator == "exact" and f_prev is not None
    sens_n = 0.0
    sens_d = 0.0
    for i in scope:
        av = np.abs(d[i] - g[i])
        if exact:
            sens_n += np.sum(
                w[i] * (2 * np.abs(g[i]) + lam * p[i] * np.abs(d[i]))
                + w[i] * av * (1 + lam * p[i])
                + wd * (av + 2 * np.abs(x[i]))
            )
        else:
            sens_n += np.sum(
                2 * np.abs(g[i]) / p[i]
                + 4 * lam * u[i] * av
                + wd * lr * (np.abs(d[i]) + np.abs(g[i])) / p[i]
                + wd * (2 + wd * lr) * (np.abs(x[i]) + np.abs(g[i]))
                + wd * (np.abs(x[i]) + np.abs(d[i]))
            )
        sens_d += np.sum(4 * w[i] * av)
    if D == 0:
        return np.inf
    ratio = N / D
    out = (sens_n + abs(ratio) * sens_d) * scale / D
    if exact:
        out += (1 + wd * lr) * (abs(f_prev) + abs(f)) / (lr * D)
    if ratio > beta_max * (1 + 1e-6) or ratio < -1e-6 * beta_max:
        return 0.0
    return float(out)


def run_am_adam(
    oracle,
    x0,
    *,
    lr,
    n_steps,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    weight_decay_mode="decoupled",
    lam=0.1,
    numerator="linear",
    per_layer=True,
    variant=None,
    beta_min=0.5,
    theta=0.7,
    beta_high=0.9,
    beta_low=0.1,
):
    """AM-Adam / AM-AdamW, section 3 (variants of section 4).

    ``weight_decay_mode`` is ``"decoupled"``, ``"proximal"`` or ``"l2"``; the
    last one is AM-Adam with an L2 penalty: ``weight_decay * x`` is added to
    ``g`` and the formulas use ``wd = 0``. ``lr`` is a number or a schedule
    (``lr[k]`` for the step k = 0, 1, ...): the linearised numerator then carries
    ``r = lr[k-1] / lr[k]`` (section 3 step 4).
    """
    if numerator not in ("exact", "linear"):
        raise ValueError(f"unknown numerator {numerator!r}")
    if weight_decay_mode not in ("decoupled", "proximal", "l2"):
        raise ValueError(f"unknown weight_decay_mode {weight_decay_mode!r}")
    beta1_max, beta2 = betas
    wd = 0.0 if weight_decay_mode == "l2" else weight_decay
    x = _copy(x0)
    xs = [_copy(x)]
    n = len(x)
    scopes = _scopes(n, per_layer)
    d = [np.zeros_like(x[i]) for i in range(n)]
    v = [np.zeros_like(x[i]) for i in range(n)]
    beta1_prod = [1.0 for _ in scopes]
    f_prev = None
    betas_applied = []
    conds = []
    for k in range(n_steps):
        t = k + 1
        lr_k = _lr_at(lr, k)
        r = _lr_ratio(lr, k)
        f, g = _evaluate(oracle, x, k)
        if weight_decay_mode == "l2":
            for i in range(n):
                g[i] = g[i] + weight_decay * x[i]

        # step 1
        v_hat = [None] * n
        for i in range(n):
            v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i]
            v_hat[i] = v[i] / (1 - beta2**t)

        step_betas = []
        step_conds = []
        for s, scope in enumerate(scopes):
            # steps 2 and 3
            c = 1 - beta1_max * beta1_prod[s]
            p = {}
            u = {}
            w = {}
            for i in scope:
                p[i] = c * (eps + np.sqrt(v_hat[i]))
                u[i] = 1 / (1 + lam * p[i])
                w[i] = u[i] / p[i]

            # step 4
            N = 0.0
            D = 0.0
            wdd = 0.0
            wgg = 0.0
            for i in scope:
                if r == 1.0:
                    N += np.sum(
                        g[i] * g[i] / p[i]
                        - lam * u[i] * (d[i] - g[i]) ** 2
                        + wd * lr_k * g[i] * d[i] / p[i]
                        + wd * (2 + wd * lr_k) * g[i] * x[i]
                        - wd * d[i] * x[i]
                    )
                else:  # the general N of step 4, with the previous step's learning rate
                    N += np.sum(
                        r * (1 + wd * lr_k) * (g[i] * d[i] / p[i] + wd * g[i] * x[i])
                        - w[i] * (d[i] - g[i]) * (g[i] + lam * p[i] * d[i])
                        - wd * x[i] * (d[i] - g[i])
                    )
                D += np.sum(w[i] * (d[i] - g[i]) ** 2)
                wdd += np.sum(w[i] * d[i] ** 2)
                wgg += np.sum(w[i] * g[i] ** 2)
            if numerator == "exact" and f_prev is not None:
                vg_w = 0.0
                xv = 0.0
                for i in scope:
                    vg_w += np.sum(w[i] * (d[i] - g[i]) * (g[i] + lam * p[i] * d[i]))
                    xv += np.sum(x[i] * (d[i] - g[i]))
                N = (1 + wd * lr_k) * (f_prev - f) / lr_k - vg_w - wd * xv
            step_conds.append(
                _adam_beta_condition(
                    g, d, x, p, u, w, scope, N, D, lam, wd, lr_k, f, f_prev, numerator, beta1_max
                )
            )

            # step 5, then the variant; on the scope's first step (d = 0) a vanishing D
            # (a gradient that is exactly zero) gives beta1_max, the limit of N / D = 1
            if k == 0 and D <= tiny * (wdd + wgg):
                beta = beta1_max
            else:
                beta = am_beta(N, D, wdd, wgg, beta1_max)
            beta = _apply_variant(beta, variant, beta_min, theta, beta_high, beta_low)
            step_betas.append(beta)

            for i in scope:
                # step 6
                d[i] = g[i] + (beta + lam * p[i]) / (1 + lam * p[i]) * (d[i] - g[i])
                # step 7
                if weight_decay_mode == "proximal":
                    x[i] = (x[i] - lr_k * d[i] / p[i]) / (1 + lr_k * wd)
                else:
                    x[i] = (1 - lr_k * wd) * x[i] - lr_k * d[i] / p[i]

            # step 8
            beta1_prod[s] *= beta

        f_prev = f
        xs.append(_copy(x))
        betas_applied.append(step_betas)
        conds.append(step_conds)
    return {
        "x": xs,
        "betas": _betas_array(betas_applied, per_layer, n),
        "beta_cond": _betas_array(conds, per_layer, n),
        "d": d,
    }
