"""Property tests of the Adaptive Memory beta rules (``docs/algorithms.md`` sections 1-4).

* ``am_beta`` / ``am_adam_beta`` never return NaN, stay in ``[0, beta_max]`` and return 0
  when ``d == g``, over float64 / float32 / float16 inputs with magnitudes from
  subnormal to overflowing; where nothing overflows they equal the oracle.
* The AM-MGD and AM-AdamW (proximal weight decay) steps equal the minimiser of the
  paper's two-plane proximal problems, solved here by enumerating active sets of the
  primal (and that solver is itself checked against SLSQP).
* "lam only clips" (section 2), checked on the library's own outputs.
* ``apply_variant``'s clip / restart semantics (section 4).
"""

import math
from contextlib import nullcontext
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import optimize

from amopt import (
    AMAdamState,
    AMState,
    am_adam_beta,
    am_adam_step,
    am_beta,
    am_momentum_step,
    apply_variant,
)

import oracle

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)

TINY32 = float(np.finfo(np.float32).eps) ** 2
TINY64 = float(np.finfo(np.float64).eps) ** 2

# Magnitude regimes per input dtype. "moderate": no overflow or underflow anywhere in
# the reductions; "tiny": squares underflow (partly or fully); "huge": squares (and in
# float16, d - g formed in the input dtype) overflow.
_SCALES = {
    "float64": {
        "moderate": (1e-3, 1.0, 1e3),
        "tiny": (1e-30, 1e-160, 1e-200, 1e-310),
        # 8e153: <g,g> + <d,d> finite but <d-g, d-g> = inf when d = -g (n = 1)
        "huge": (1e30, 1e150, 8e153, 1e155, 1e200),
    },
    "float32": {
        "moderate": (1e-3, 1.0, 1e3),
        "tiny": (1e-20, 1e-30, 1e-42),
        "huge": (1e18, 1.1e19, 1e20, 1e30),
    },
    "float16": {
        "moderate": (1e-2, 1.0, 1e2),
        "tiny": (1e-4, 1e-7),
        "huge": (1e4, 6e4),
    },
}
_MODES = (
    "independent",
    "equal",
    "zeros",
    "d_zero",
    "g_zero",
    "parallel",
    "opposite",
    "den_overflow",
    "near",
    "ulp",
    "mixed",
)


def _acc_dtype(dtype):
    # the core accumulates every scope's sums in float64 (amopt.core.reduce.accumulation_dtype)
    return np.dtype(np.float64)


@st.composite
def scope_pairs(draw, dtypes=("float64", "float32", "float16"), regimes=None):
    """``(g, d, moderate)``: one beta scope in one dtype.

    ``moderate`` is True when every entry comes from the moderate regime.
    """
    name = draw(st.sampled_from(dtypes))
    dtype = np.dtype(name)
    scales = _SCALES[name]
    regime = draw(st.sampled_from(regimes or tuple(scales)))
    scale = draw(st.sampled_from(scales[regime]))
    n = draw(st.integers(1, 8))
    unit = hnp.arrays(np.float64, n, elements=st.floats(-1.0, 1.0))
    g64 = draw(unit) * scale
    mode = draw(st.sampled_from(_MODES))
    moderate = regime == "moderate"
    if mode == "independent":
        d64 = draw(unit) * scale
    elif mode in ("equal", "ulp"):
        d64 = g64
    elif mode == "zeros":
        g64 = np.zeros(n)
        d64 = g64
    elif mode == "d_zero":
        d64 = np.zeros(n)
    elif mode == "g_zero":
        d64, g64 = g64, np.zeros(n)
    elif mode == "parallel":
        d64 = draw(st.floats(-3.0, 3.0)) * g64
    elif mode == "opposite":
        d64 = -g64
    elif mode == "den_overflow" and regime == "huge":
        signs = np.where(draw(unit) < 0, -1.0, 1.0)
        if dtype == np.float16:  # d - g overflows if formed in float16, not in float32
            g64 = signs * draw(st.floats(32768.0, 60000.0))
        else:  # <g,g> = <d,d> = max/3: the guard's reference is finite, <d-g,d-g> = inf
            g64 = signs * math.sqrt(float(np.finfo(dtype).max) / 3 / n)
        d64 = -g64
        moderate = False
    elif mode == "den_overflow":
        d64 = -g64
    elif mode == "near":
        d64 = g64 * (1.0 + 1e-6 * draw(unit))
    else:  # "mixed": d from another (possibly extreme) scale of the same dtype
        regime2 = draw(st.sampled_from(regimes or tuple(scales)))
        d64 = draw(unit) * draw(st.sampled_from(scales[regime2]))
        moderate = moderate and regime2 == "moderate"
    with np.errstate(over="ignore", under="ignore"):
        g = g64.astype(dtype)
        d = d64.astype(dtype)
    if mode in ("equal", "zeros"):
        d = g.copy()
    elif mode == "ulp":  # d one ulp above g in one coordinate: den at the guard's scale
        d = g.copy()
        i = draw(st.integers(0, n - 1))
        d[i] = np.nextafter(g[i], dtype.type(np.inf))
    return g, d, moderate


def _fp_context(moderate):
    """Overflow (and inf - inf) is expected outside the moderate regime, not inside it."""
    return nullcontext() if moderate else np.errstate(over="ignore", invalid="ignore")


def _check_beta_range(beta, dtype, beta_max, g, d):
    b = np.asarray(beta)
    assert b.shape == ()
    assert b.dtype == _acc_dtype(dtype)
    value = float(b)
    assert not math.isnan(value)
    # beta_max as seen in the accumulation dtype (float32(0.1) > 0.1)
    assert 0.0 <= value <= float(np.asarray(beta_max, dtype=b.dtype))
    if np.array_equal(g, d):
        assert value == 0.0
    return value


# ----------------------------------------------------------------- 1. the beta rules


@SETTINGS
@given(
    pair=scope_pairs(),
    lam=st.floats(0.0, 10.0),
    beta_max=st.floats(0.0, 1.0),
    exact=st.booleans(),
    f_unit=st.floats(-2.0, 2.0),
    lr=st.floats(1e-3, 1.0),
)
# only <d-g, d-g> overflows (the guard's reference stays finite): inf/inf or -inf/inf
@example((np.array([8e153]), np.array([-8e153]), False), 0.5, 0.9, False, 0.0, 0.1)
@example((np.array([8e153]), np.array([-8e153]), False), 0.0, 0.9, False, 0.0, 0.1)
@example((np.array([8e153]), np.array([-8e153]), False), 0.5, 0.9, True, 1.0, 0.1)
@example((np.array([1.1e19], "f4"), np.array([-1.1e19], "f4"), False), 0.5, 1.0, False, 0.0, 0.1)
def test_am_beta_never_nan_in_range_zero_when_d_equals_g(pair, lam, beta_max, exact, f_unit, lr):
    g, d, moderate = pair
    kwargs = {}
    if exact:
        # an f decrease on the scale lr * <g, d> of the inputs, kept finite
        mag = float(np.max(np.abs(np.concatenate([g, d])), initial=0.0).astype(np.float64))
        kwargs = {"lr": lr, "f_decrease": f_unit * lr * min(mag * mag, 1e300)}
    with _fp_context(moderate):
        beta = am_beta(g, d, lam=lam, beta_max=beta_max, **kwargs)
    _check_beta_range(beta, g.dtype, beta_max, g, d)


class Ref(NamedTuple):
    """A float64 evaluation of a beta rule: ``want`` (guarded, clipped), the unclipped
    ``ratio`` num / den, ``scale`` = sum |numerator terms| / den (the size of the
    rounding error of the ratio, relative), ``guard`` (True: den <= tiny * ref,
    False: clearly above, None: within 1e-4 of the threshold) and ``beta_max``."""

    want: float
    ratio: float
    scale: float
    guard: bool | None
    beta_max: float


def _ref(num, terms, den, dd, gg, beta_max, tiny=TINY64):
    threshold = tiny * (dd + gg)
    if tiny == TINY64:
        want = oracle.am_beta(num, den, dd, gg, beta_max)
    else:  # the same rule with the float32 accumulation threshold
        want = 0.0 if den <= threshold else float(np.clip(num / den, 0.0, beta_max))
    guard = den <= threshold
    if abs(den - threshold) <= 1e-4 * threshold:
        guard = None
    ratio = num / den if den > 0 else 0.0
    return Ref(want, ratio, terms / den if den > 0 else 0.0, guard, beta_max)


def _assert_beta_matches(got, ref, rel):
    """``got`` is the guarded, clipped ratio up to a relative error ``rel`` of the ratio.

    The interval is clipped after widening, so a clipped value must be exact (up to
    ``rel`` absolute, which covers rounding beta_max to float32).
    """
    info = (got, ref)
    if ref.guard is True:
        assert got == 0.0 and ref.want == 0.0, info
        return
    tol = rel * max(abs(ref.ratio), ref.scale)
    lo = min(max(ref.ratio - tol, 0.0), ref.beta_max) - rel
    hi = min(max(ref.ratio + tol, 0.0), ref.beta_max) + rel
    if ref.guard is None and got == 0.0:
        return
    assert lo <= got <= hi, info
    assert lo <= ref.want <= hi or ref.guard is None, info


def _am_beta_reference(g, d, lam, beta_max, lr=None, f_decrease=None, tiny=TINY64):
    """algorithms.md section 2, steps 2-4, in float64."""
    g = g.astype(np.float64)
    d = d.astype(np.float64)
    v = d - g
    den = float(v @ v)
    if f_decrease is None:
        num = (1 + lam) * float(g @ g) - lam * den
        terms = (1 + lam) * float(g @ g) + lam * den
    else:
        f_term = f_decrease * (1 + lam) / lr
        num = f_term - float(v @ (g + lam * d))
        terms = abs(f_term) + float(np.abs(v) @ (np.abs(g) + lam * np.abs(d)))
    return _ref(num, terms, den, float(d @ d), float(g @ g), beta_max, tiny)


@SETTINGS
@given(
    pair=scope_pairs(dtypes=("float64",), regimes=("moderate",)),
    lam=st.floats(0.0, 10.0),
    beta_max=st.floats(0.0, 1.0),
    exact=st.booleans(),
    f_unit=st.floats(-2.0, 2.0),
    lr=st.floats(1e-3, 1.0),
)
# just below / above the zero-denominator guard den <= eps^2 (<d,d> + <g,g>)
@example(
    (np.array([1.0, 0.5]), np.array([np.nextafter(1.0, 2.0), 0.5]), True), 0, 0.9, False, 0, 1
)
@example((np.array([1.0]), np.array([1.0 + 2.0**-50]), True), 0.0, 0.9, False, 0.0, 1.0)
def test_am_beta_matches_oracle_float64(pair, lam, beta_max, exact, f_unit, lr):
    g, d, _ = pair
    mag = float(np.max(np.abs(np.concatenate([g, d])), initial=0.0))
    kw = {"lr": lr, "f_decrease": f_unit * lr * mag * mag} if exact else {}
    got = float(am_beta(g, d, lam=lam, beta_max=beta_max, **kw))
    _assert_beta_matches(got, _am_beta_reference(g, d, lam, beta_max, **kw), 1e-12)


@SETTINGS
@given(
    pair=scope_pairs(dtypes=("float16",)),
    lam=st.floats(0.0, 10.0),
    beta_max=st.floats(0.0, 1.0),
    exact=st.booleans(),
    f_unit=st.floats(-2.0, 2.0),
)
@example((np.array([6e4, -6e4], "f2"), np.array([-6e4, 6e4], "f2"), False), 0.0, 1.0, False, 0.0)
@example((np.array([6e4, 1.0], "f2"), np.array([-6e4, 0.0], "f2"), False), 0.5, 1.0, True, 1.0)
def test_am_beta_float16_is_the_float32_rule_on_the_same_values(
    pair, lam, beta_max, exact, f_unit
):
    """Half inputs (|x| <= 60000) are reduced in float32: d - g must not overflow in float16.

    The reference is the rule evaluated in float64 on the same float16 values, with the
    float32 guard threshold; the tolerance covers float32 rounding of the reductions.
    """
    g, d, _ = pair
    lr = 0.5
    kw = {}
    if exact:
        mag = float(np.max(np.abs(np.concatenate([g, d])), initial=0.0))
        kw = {"lr": lr, "f_decrease": f_unit * lr * mag * mag}
    got = float(am_beta(g, d, lam=lam, beta_max=beta_max, **kw))
    ref = _am_beta_reference(g, d, lam, beta_max, tiny=TINY32, **kw)
    _assert_beta_matches(got, ref, 1e-5)


def _pos_arrays(n, lo, hi):
    return hnp.arrays(np.float64, n, elements=st.floats(lo, hi))


@st.composite
def adam_scopes(draw, dtypes=("float64", "float32", "float16"), regimes=None):
    g, d, moderate = draw(scope_pairs(dtypes=dtypes, regimes=regimes))
    n = g.size
    dtype = g.dtype
    with np.errstate(over="ignore", under="ignore"):
        x = (draw(hnp.arrays(np.float64, n, elements=st.floats(-1.0, 1.0))) * 3.0).astype(dtype)
        p = (10.0 ** draw(_pos_arrays(n, -3.0, 3.0))).astype(dtype)
    return g, d, x, p, moderate


@SETTINGS
@given(
    scope=adam_scopes(),
    lam=st.floats(0.0, 10.0),
    beta_max=st.floats(0.0, 1.0),
    wd=st.sampled_from([0.0, 1e-3, 0.1]),
    lr=st.floats(1e-4, 1.0),
    exact=st.booleans(),
    f_unit=st.floats(-2.0, 2.0),
)
@example(
    (np.array([8e153]), np.array([-8e153]), np.array([0.0]), np.array([1.0]), False),
    0.5, 0.9, 0.0, 0.1, False, 0.0,
)  # fmt: skip
def test_am_adam_beta_never_nan_in_range_zero_when_d_equals_g(
    scope, lam, beta_max, wd, lr, exact, f_unit
):
    g, d, x, p, moderate = scope
    kw = {}
    if exact:
        mag = float(np.max(np.abs(np.concatenate([g, d])), initial=0.0).astype(np.float64))
        kw = {"f_decrease": f_unit * lr * min(mag * mag, 1e300)}
    with _fp_context(moderate):
        beta = am_adam_beta(g, d, x, p, lr=lr, lam=lam, beta_max=beta_max, weight_decay=wd, **kw)
    _check_beta_range(beta, g.dtype, beta_max, g, d)


def _am_adam_beta_reference(g, d, x, p, lr, lam, beta_max, wd, f_decrease=None):
    """algorithms.md section 3, steps 4-5, in float64."""
    u = 1.0 / (1.0 + lam * p)
    w = u / p
    v = d - g
    if f_decrease is None:
        t = [
            g * g / p,
            -lam * u * v * v,
            wd * lr * g * d / p,
            wd * (2 + wd * lr) * g * x,
            -wd * d * x,
        ]
    else:
        t = [
            np.full(1, (1 + wd * lr) * f_decrease / lr),
            -w * v * (g + lam * p * d),
            -wd * x * v,
        ]
    num = sum(float(np.sum(ti)) for ti in t)
    terms = sum(float(np.sum(np.abs(ti))) for ti in t)
    den = float(np.sum(w * v * v))
    return _ref(num, terms, den, float(np.sum(w * d * d)), float(np.sum(w * g * g)), beta_max)


@SETTINGS
@given(
    scope=adam_scopes(dtypes=("float64",), regimes=("moderate",)),
    lam=st.floats(0.0, 10.0),
    beta_max=st.floats(0.0, 1.0),
    wd=st.sampled_from([0.0, 1e-3, 0.1]),
    lr=st.floats(1e-4, 1.0),
    exact=st.booleans(),
    f_unit=st.floats(-2.0, 2.0),
)
def test_am_adam_beta_matches_oracle_float64(scope, lam, beta_max, wd, lr, exact, f_unit):
    g, d, x, p, _ = scope
    kw = {"f_decrease": f_unit * lr} if exact else {}
    got = float(am_adam_beta(g, d, x, p, lr=lr, lam=lam, beta_max=beta_max, weight_decay=wd, **kw))
    ref = _am_adam_beta_reference(g, d, x, p, lr, lam, beta_max, wd, **kw)
    _assert_beta_matches(got, ref, 1e-12)


@SETTINGS
@given(
    scope=adam_scopes(dtypes=("float64",), regimes=("moderate",)),
    lam=st.floats(0.0, 10.0),
    wd=st.sampled_from([0.0, 1e-3, 0.1]),
    lr=st.floats(1e-4, 1.0),
)
def test_linearised_numerator_is_exact_numerator_at_linear_f_decrease(scope, lam, wd, lr):
    """Sections 2.3 and 3.4: linear N == exact N at f_prev - f = lr g.(P^-1 d + wd x)."""
    g, d, x, p, _ = scope
    big = 1e300  # no upper clip: the ratios are compared wherever they are >= 0
    lin = float(am_beta(g, d, lam=lam, beta_max=big))
    kw0 = {"lr": lr, "f_decrease": lr * float(g @ d)}
    ex = float(am_beta(g, d, lam=lam, beta_max=big, **kw0))
    ref = _am_beta_reference(g, d, lam, big)  # the linear ratio, with the larger error scale
    ref = ref._replace(scale=max(ref.scale, _am_beta_reference(g, d, lam, big, **kw0).scale))
    _assert_beta_matches(lin, ref, 1e-12)
    _assert_beta_matches(ex, ref, 1e-12)

    fd = lr * float(np.sum(g * (d / p + wd * x)))
    kw = {"lr": lr, "lam": lam, "beta_max": big, "weight_decay": wd}
    lin = float(am_adam_beta(g, d, x, p, **kw))
    ex = float(am_adam_beta(g, d, x, p, f_decrease=fd, **kw))
    ref = _am_adam_beta_reference(g, d, x, p, lr, lam, big, wd)
    ref2 = _am_adam_beta_reference(g, d, x, p, lr, lam, big, wd, f_decrease=fd)
    ref = ref._replace(scale=max(ref.scale, ref2.scale))
    _assert_beta_matches(lin, ref, 1e-12)
    _assert_beta_matches(ex, ref, 1e-12)


# ----------------------------------------------------------------- 2. the proximal step


def _two_plane_prox(a0, a, b0, b, h, q, objective):
    """argmin_y max(a0 + a.y, b0 + b.y) + 0.5 * sum(h * y**2) + q.y, h > 0.

    Enumerates the active sets of the strongly convex primal: plane a alone, plane b
    alone, or both (equality-constrained QP solved from its KKT system, whose
    multiplier theta is the weight of plane b in the optimal subgradient). A candidate
    that satisfies its own optimality conditions is the unique minimiser; rounding ties
    at the boundaries between cases are broken by the objective value.
    Returns ``(y, theta, case)``.
    """
    n = a.size
    valid = []
    y1 = -(a + q) / h
    if a0 + a @ y1 >= b0 + b @ y1:
        valid.append((y1, 0.0, "plane 1"))
    y2 = -(b + q) / h
    if b0 + b @ y2 >= a0 + a @ y2:
        valid.append((y2, 1.0, "plane 2"))
    kkt = np.zeros((n + 1, n + 1))
    kkt[:n, :n] = np.diag(h)
    kkt[:n, n] = b - a  # h y + q + (1 - theta) a + theta b = 0
    kkt[n, :n] = a - b  # a0 + a.y = b0 + b.y
    sol = np.linalg.solve(kkt, np.concatenate([-(q + a), [b0 - a0]]))
    y3, theta = sol[:n], float(sol[n])
    if 0.0 <= theta <= 1.0:
        valid.append((y3, theta, "both"))
    if not valid:  # only through rounding exactly at a boundary
        valid = [(y1, 0.0, "plane 1"), (y2, 1.0, "plane 2"), (y3, min(max(theta, 0), 1), "both")]
    return min(valid, key=lambda c: objective(c[0]))


def _slsqp_prox(a0, a, b0, b, objective_smooth, n):
    """The same problem in epigraph form, by SLSQP (cross-check of ``_two_plane_prox``).

    The smooth part is quadratic, so its central differences (step 1e-3) are exact up
    to rounding; they give SLSQP an accurate gradient without a hand-derived one.
    """

    def grad_smooth(y):
        e = np.eye(n) * 1e-3
        return np.array([(objective_smooth(y + ei) - objective_smooth(y - ei)) / 2e-3 for ei in e])

    def above(c0, c):  # s >= c0 + c.y
        return {
            "type": "ineq",
            "fun": lambda z: z[n] - (c0 + c @ z[:n]),
            "jac": lambda z: np.append(-c, 1.0),
        }

    cons = [above(a0, a), above(b0, b)]
    z0 = np.zeros(n + 1)
    z0[n] = max(a0, b0)
    res = optimize.minimize(
        lambda z: z[n] + objective_smooth(z[:n]),
        z0,
        jac=lambda z: np.append(grad_smooth(z[:n]), 1.0),
        method="SLSQP",
        constraints=cons,
        options={"ftol": 1e-14, "maxiter": 1000},
    )
    # status 8: no further descent possible at this precision (the point is checked after)
    assert res.status in (0, 8), res.message
    return res.x[:n]


def _quadratic(rng, n):
    """A random quadratic f (convex or indefinite) and its gradient."""
    m = rng.standard_normal((n, n))
    if rng.random() < 0.4:
        A = m @ m.T / n
    else:  # indefinite: needed for beta = 0 at lam = 0 (f(x_{t-1}) below the tangent plane)
        A = (m + m.T) / 2 - rng.uniform(0.0, 3.0) * np.eye(n)
    c = rng.standard_normal(n)
    return (lambda x: 0.5 * x @ A @ x + c @ x), (lambda x: A @ x + c)


def _mgd_problem(seed, lam, beta_max):
    """Paper eq. (model_based2) with the beta_max cap folded into the model.

    f^m(x) = max(p1, p1 + beta_max (p2 - p1)), p1 = f(x_t) + <g, x - x_t>,
    p2 = f(x_{t-1}) + <(x_{t-1} - x_t)/lr, x - x_t>; its dual weight on the second
    piece is beta / beta_max with beta in [0, beta_max] (beta_max = 1: the paper's model).
    """
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 11))
    f, grad = _quadratic(rng, n)
    x_t = rng.standard_normal(n)
    g = grad(x_t)
    lr = float(rng.uniform(0.05, 1.0))
    d_t = rng.uniform(-1.5, 1.5) * g + rng.uniform(0.0, 3.0) * rng.standard_normal(n)
    x_prev = x_t + lr * d_t
    f_t, f_hat = float(f(x_t)), float(f(x_prev))
    m = (x_prev - x_t) / lr  # the momentum plane's slope

    def p1(y):
        return f_t + g @ y

    def p2(y):
        return f_hat + m @ y

    def smooth(y):
        return (lam + 1) / (2 * lr) * (y @ y) + lam / lr * ((x_prev - x_t) @ y)

    def objective(y):
        return max(p1(y), p1(y) + beta_max * (p2(y) - p1(y))) + smooth(y)

    planes = (f_t, g, f_t + beta_max * (f_hat - f_t), g + beta_max * (m - g))
    h = np.full(n, (lam + 1) / lr)
    q = lam * m
    return dict(
        n=n, x_t=x_t, g=g, d=d_t, lr=lr, f_t=f_t, f_hat=f_hat, planes=planes, h=h, q=q,
        objective=objective, smooth=smooth,
    )  # fmt: skip


def _adam_problem(seed, lam, beta_max, wd):
    """Paper eq. (model_based4) / Supplement A, with P = diag(p) from algorithms.md section 3.

    argmin_x f^m(x) + |x - x_t|^2_Pt / (2 lr) + lam <d, x - x_t>_P + wd/2 |x|^2_Pt,
    Pt = (I + lam P) P, and the beta_max cap folded into the model as for AM-MGD.
    """
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 11))
    f, grad = _quadratic(rng, n)
    x_t = rng.standard_normal(n)
    g = grad(x_t)
    lr = float(rng.uniform(0.01, 1.0))
    step = int(rng.integers(1, 30))  # steps taken so far: this is step t = step + 1
    beta2 = float(rng.choice([0.9, 0.99, 0.999]))
    eps = 1e-8
    prod = float(rng.uniform(0.0, 0.9))
    v_prev = rng.uniform(0.1, 2.0, n) ** 2
    d_t = rng.uniform(-1.5, 1.5) * g + rng.uniform(0.0, 3.0) * rng.standard_normal(n)
    # preconditioner of algorithms.md section 3 steps 1-3
    v = beta2 * v_prev + (1 - beta2) * g * g
    p = (1 - beta_max * prod) * (eps + np.sqrt(v / (1 - beta2 ** (step + 1))))
    pt = (1 + lam * p) * p
    x_prev = x_t + lr * d_t / p
    f_t, f_hat = float(f(x_t)), float(f(x_prev))

    def p1(y):
        return f_t + g @ y

    def p2(y):
        return f_hat + d_t @ y

    def smooth(y):
        x = x_t + y
        return (pt @ (y * y)) / (2 * lr) + lam * ((p * d_t) @ y) + wd / 2 * (pt @ (x * x))

    def objective(y):
        return max(p1(y), p1(y) + beta_max * (p2(y) - p1(y))) + smooth(y)

    planes = (f_t, g, f_t + beta_max * (f_hat - f_t), g + beta_max * (d_t - g))
    h = (1 / lr + wd) * pt
    q = lam * p * d_t + wd * pt * x_t
    state = AMAdamState(step, (d_t.copy(),), (v_prev.copy(),), (np.asarray(prod),), f_hat)
    return dict(
        n=n, x_t=x_t, g=g, d=d_t, p=p, lr=lr, f_t=f_t, planes=planes, h=h, q=q,
        objective=objective, smooth=smooth, state=state, beta2=beta2, eps=eps,
    )  # fmt: skip


def _solve(prob):
    a0, a, b0, b = prob["planes"]
    return _two_plane_prox(a0, a, b0, b, prob["h"], prob["q"], prob["objective"])


@pytest.mark.parametrize("beta_max", [1.0, 0.9, 0.5])
@pytest.mark.parametrize("lam", [0.0, 0.1, 1.0])
def test_am_mgd_step_is_the_two_plane_prox_step(lam, beta_max):
    cases = {"plane 1": 0, "plane 2": 0, "both": 0}
    for seed in range(80):
        prob = _mgd_problem(seed, lam, beta_max)
        y_ref, theta, case = _solve(prob)
        cases[case] += 1
        state = AMState(step=1, d=(prob["d"].copy(),), f_prev=prob["f_hat"])
        x_new, new_state, beta = am_momentum_step(
            prob["x_t"], prob["g"], state, lr=prob["lr"], lam=lam, beta_max=beta_max,
            numerator="exact", f=prob["f_t"],
        )  # fmt: skip
        tol = 1e-10 * np.linalg.norm(y_ref)
        np.testing.assert_allclose(x_new - prob["x_t"], y_ref, rtol=0, atol=tol, err_msg=case)
        # x_{t+1} = x_t - lr d_{t+1}: the stored momentum is the aggregated slope
        np.testing.assert_allclose(new_state.d[0], -y_ref / prob["lr"], rtol=0, atol=tol)
        assert abs(float(beta) - beta_max * theta) <= 1e-9, (seed, case, float(beta), theta)
        assert new_state.f_prev == prob["f_t"]
    # the random problems exercise all three solution types (beta = 0, beta_max, interior)
    assert min(cases.values()) >= 5, cases


@pytest.mark.parametrize("wd", [0.0, 0.05])
@pytest.mark.parametrize("beta_max", [1.0, 0.9])
@pytest.mark.parametrize("lam", [0.0, 0.1, 1.0])
def test_am_adamw_proximal_step_is_the_preconditioned_prox_step(lam, beta_max, wd):
    cases = {"plane 1": 0, "plane 2": 0, "both": 0}
    for seed in range(80):
        prob = _adam_problem(seed, lam, beta_max, wd)
        y_ref, theta, case = _solve(prob)
        cases[case] += 1
        x_new, new_state, beta = am_adam_step(
            prob["x_t"], prob["g"], prob["state"], lr=prob["lr"],
            betas=(beta_max, prob["beta2"]), eps=prob["eps"], weight_decay=wd,
            weight_decay_mode="proximal", lam=lam, numerator="exact", f=prob["f_t"],
            per_layer=False,
        )  # fmt: skip
        tol = 1e-10 * np.linalg.norm(y_ref)
        np.testing.assert_allclose(x_new - prob["x_t"], y_ref, rtol=0, atol=tol, err_msg=case)
        assert abs(float(beta) - beta_max * theta) <= 1e-9, (seed, case, float(beta), theta)
        # Supplement A, form (I): x_{t+1} = (x_t - lr P^-1 d_{t+1}) / (1 + wd lr)
        x_ref = prob["x_t"] + y_ref
        d_ref = prob["p"] * (prob["x_t"] - (1 + wd * prob["lr"]) * x_ref) / prob["lr"]
        np.testing.assert_allclose(
            new_state.exp_avg[0], d_ref, rtol=0, atol=1e-9 * np.linalg.norm(d_ref)
        )
    assert min(cases.values()) >= 5, cases


@pytest.mark.parametrize("kind", ["mgd", "adam"])
def test_active_set_solver_agrees_with_slsqp(kind):
    """Self-check of the reference solver on the literal objectives."""
    for seed in range(6):
        for lam in (0.0, 1.0):
            if kind == "mgd":
                prob = _mgd_problem(seed, lam, 1.0)
            else:
                prob = _adam_problem(seed, lam, 1.0, 0.05)
            y_ref, _, _ = _solve(prob)
            a0, a, b0, b = prob["planes"]
            y_qp = _slsqp_prox(a0, a, b0, b, prob["smooth"], prob["n"])
            obj = prob["objective"]
            assert obj(y_ref) <= obj(y_qp) + 1e-12 * (1 + abs(obj(y_qp)))
            np.testing.assert_allclose(y_qp, y_ref, rtol=0, atol=1e-6 * np.linalg.norm(y_ref))


# ----------------------------------------------------------------- 3. lam only clips


@SETTINGS
@given(
    pair=scope_pairs(dtypes=("float64",), regimes=("moderate",)),
    lam=st.floats(0.0, 10.0),
    beta_max=st.floats(0.0, 1.0),
    exact=st.booleans(),
    f_unit=st.floats(-2.0, 2.0),
    lr=st.floats(1e-3, 1.0),
)
def test_lam_only_moves_the_clipping_bounds(pair, lam, beta_max, exact, f_unit, lr):
    """gamma = (beta + lam)/(1 + lam) = clip(beta_0, lam/(1+lam), (beta_max+lam)/(1+lam)).

    beta_0 is the lam = 0 ratio num_0 / den before clipping; the library only exposes it
    clipped below at 0, i.e. am_beta(lam=0, beta_max=inf) = max(beta_0, 0), which is
    enough since the lower bound lam/(1+lam) >= 0. The guarded case (d = g) gives
    beta_0 = 0 and gamma = lam/(1+lam) on both sides.
    """
    g, d, _ = pair
    f_t = 1.0
    f_prev = f_t + f_unit * lr
    kw = {"lr": lr, "f_decrease": f_prev - f_t} if exact else {}
    beta = float(am_beta(g, d, lam=lam, beta_max=beta_max, **kw))
    beta0 = float(am_beta(g, d, lam=0.0, beta_max=np.inf, **kw))
    assert beta0 >= 0.0
    gamma = (beta + lam) / (1 + lam)
    low, high = lam / (1 + lam), (beta_max + lam) / (1 + lam)

    def clip(z):
        return min(max(z, low), high)

    # float64 error scale of the library's ratios: sum |numerator terms| / den
    v = d - g
    den = float(v @ v)
    guarded = den <= TINY64 * float(d @ d + g @ g)
    if den > 0:
        terms = float(np.abs(v) @ (np.abs(g) + np.abs(d)) + g @ g)
        terms += abs(f_prev - f_t) / lr if exact else 0.0
        tol = 1e-12 * (terms / den + 1.0)
    else:
        tol = 0.0
    info = (gamma, beta, beta0, low, high, tol)
    if guarded:  # both rules take beta = 0: gamma = lam / (1 + lam)
        assert beta0 == 0.0 and abs(gamma - low) <= 1e-15, info
        want = low
    else:  # gamma in clip([beta0 - tol, beta0 + tol]), clipped after widening
        assert clip(beta0 - tol) - 1e-15 <= gamma <= clip(beta0 + tol) + 1e-15, info
        want = clip(beta0)

    # the same on a step: d_{t+1} = g + gamma (d - g), x_{t+1} = x_t - lr d_{t+1}
    x = np.linspace(-1.0, 1.0, g.size)
    state = AMState(step=1, d=(d.copy(),), f_prev=f_prev)
    x_new, new_state, _ = am_momentum_step(
        x, g, state, lr=lr, lam=lam, beta_max=beta_max,
        numerator="exact" if exact else "linear", f=f_t,
    )  # fmt: skip
    d_want = g + want * (d - g)
    width = clip(beta0 + tol) - clip(beta0 - tol) if not guarded else 0.0
    atol = (width + 1e-15) * np.abs(d - g) + 1e-15 * (np.abs(g) + np.abs(d))
    np.testing.assert_array_less(np.abs(new_state.d[0] - d_want), atol + 1e-300)
    np.testing.assert_allclose(x_new, x - lr * new_state.d[0], rtol=1e-15, atol=1e-15)


# ----------------------------------------------------------------- 4. variants


@st.composite
def variant_inputs(draw):
    name = draw(st.sampled_from(["float64", "float32"]))
    width = 64 if name == "float64" else 32
    unit = st.floats(0.0, 1.0, width=width)
    theta, beta_min, high, low = (draw(unit) for _ in range(4))
    special = st.sampled_from([theta, beta_min, 0.0, 1.0])
    shape = draw(st.sampled_from([(), (1,), (5,)]))
    beta = draw(hnp.arrays(np.dtype(name), shape, elements=st.one_of(unit, special)))
    return beta, theta, beta_min, high, low


@SETTINGS
@given(inputs=variant_inputs())
def test_apply_variant_restart_and_clip(inputs):
    beta, theta, beta_min, high, low = inputs
    dt = beta.dtype
    kw = {"beta_min": beta_min, "theta": theta, "beta_high": high, "beta_low": low}

    out = np.asarray(apply_variant(beta, "restart", **kw))
    assert out.shape == beta.shape and out.dtype == dt
    assert np.all((out == dt.type(high)) | (out == dt.type(low)))
    above = beta >= dt.type(theta)  # the threshold is inclusive
    np.testing.assert_array_equal(out, np.where(above, dt.type(high), dt.type(low)))
    at = np.asarray(apply_variant(np.asarray(theta, dtype=dt), "restart", **kw))
    assert at == dt.type(high)

    out = np.asarray(apply_variant(beta, "clip", **kw))
    assert out.shape == beta.shape and out.dtype == dt
    assert np.all(out >= dt.type(beta_min))
    np.testing.assert_array_equal(out[beta >= beta_min], beta[beta >= beta_min])
    assert np.all(out[beta < beta_min] == dt.type(beta_min))

    assert apply_variant(beta, None, **kw) is beta


def test_apply_variant_rejects_unknown_variant():
    with pytest.raises(ValueError, match="variant"):
        apply_variant(np.asarray(0.5), "restrat")


def test_restart_threshold_paper_values():
    b = np.array([0.0, 0.1, 0.69, 0.7, 0.71, 0.9, 1.0])
    np.testing.assert_array_equal(apply_variant(b, "restart"), [0.1, 0.1, 0.1, 0.9, 0.9, 0.9, 0.9])
    np.testing.assert_array_equal(
        apply_variant(b, "clip", beta_min=0.5), [0.5, 0.5, 0.69, 0.7, 0.71, 0.9, 1.0]
    )
