"""Checks of user input (kept for imports; the checks live in :mod:`amopt._config`)."""

from __future__ import annotations

from amopt._config import (
    AMConfig,
    check_betas,
    check_bool,
    check_choice,
    check_int,
    check_interval,
    check_nonnegative,
    check_positive,
    check_weight_decay_mode,
)

__all__ = [
    "check_am_options",
    "check_betas",
    "check_bool",
    "check_choice",
    "check_int",
    "check_interval",
    "check_nonnegative",
    "check_positive",
    "check_weight_decay_mode",
]


def check_am_options(
    *, lam, numerator, variant, beta_min, theta, beta_high, beta_low, per_layer
) -> dict:
    """Validate the options shared by every AM method."""
    cfg = AMConfig(
        lam=lam,
        numerator=numerator,
        variant=variant,
        beta_min=beta_min,
        theta=theta,
        beta_high=beta_high,
        beta_low=beta_low,
        per_layer=per_layer,
    )
    keys = ("lam", "numerator", "variant", "beta_min", "theta", "beta_high", "beta_low")
    return {k: getattr(cfg, k) for k in (*keys, "per_layer")}
