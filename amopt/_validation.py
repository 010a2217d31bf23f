"""Checks of user input: each error names the parameter, the value and what is allowed."""

from __future__ import annotations

import math
import numbers
from typing import Any

from amopt._core import NUMERATORS, VARIANTS, WEIGHT_DECAY_MODES

__all__ = [
    "check_positive",
    "check_nonnegative",
    "check_interval",
    "check_betas",
    "check_choice",
    "check_int",
    "check_bool",
]


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {name}={value!r}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN; got {name}=nan")
    return value


def check_positive(name: str, value: Any) -> float:
    """A finite real number > 0 (e.g. ``lr``)."""
    v = _real(name, value)
    if not (0 < v < math.inf):
        raise ValueError(f"{name} must be a finite number > 0; got {name}={value!r}")
    return v


def check_nonnegative(name: str, value: Any) -> float:
    """A finite real number >= 0 (``lam``, ``eps``, ``weight_decay``, ``gtol``)."""
    v = _real(name, value)
    if not (0 <= v < math.inf):
        raise ValueError(f"{name} must be a finite number >= 0; got {name}={value!r}")
    return v


def check_interval(name: str, value: Any, lo: float, hi: float, *, hi_open: bool = False) -> float:
    """A real number in ``[lo, hi]`` (or ``[lo, hi)``)."""
    v = _real(name, value)
    ok = lo <= v < hi if hi_open else lo <= v <= hi
    if not ok:
        rng = f"[{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise ValueError(f"{name} must be in {rng}; got {name}={value!r}")
    return v


def check_betas(name: str, value: Any) -> tuple[float, float]:
    """A pair ``(beta1, beta2)`` with both entries in ``[0, 1)``."""
    try:
        b1, b2 = value
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be a pair (beta1, beta2) with entries in [0, 1); got {name}={value!r}"
        ) from None
    return (
        check_interval(f"{name}[0]", b1, 0.0, 1.0, hi_open=True),
        check_interval(f"{name}[1]", b2, 0.0, 1.0, hi_open=True),
    )


def check_choice(name: str, value: Any, choices: tuple) -> Any:
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {allowed}; got {name}={value!r}")
    return value


def check_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer; got {name}={value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be an integer {rng}; got {name}={value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False; got {name}={value!r}")
    return value


def check_am_options(
    *, lam, numerator, variant, beta_min, theta, beta_high, beta_low, per_layer
) -> dict:
    """Validate the options shared by every AM method."""
    return {
        "lam": check_nonnegative("lam", lam),
        "numerator": check_choice("numerator", numerator, NUMERATORS),
        "variant": check_choice("variant", variant, VARIANTS),
        "beta_min": check_interval("beta_min", beta_min, 0.0, 1.0),
        "theta": check_interval("theta", theta, 0.0, 1.0),
        "beta_high": check_interval("beta_high", beta_high, 0.0, 1.0),
        "beta_low": check_interval("beta_low", beta_low, 0.0, 1.0),
        "per_layer": check_bool("per_layer", per_layer),
    }


def check_weight_decay_mode(value: Any) -> str:
    return check_choice("weight_decay_mode", value, WEIGHT_DECAY_MODES)
