"""Validated, frozen configuration of the AM rules, and the checks of user input.

One place builds and validates what the rule needs (:class:`AMConfig`) and checks
every other hyper-parameter; ``minimize`` and the torch optimizers use the same
functions and so give the same messages. Each error names the parameter, the value
and what is allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
from collections.abc import Callable
from typing import Any, TypeVar

from amopt.core.rule import NUMERATORS, VARIANTS, WEIGHT_DECAY_MODES

__all__ = [
    "AMConfig",
    "check_betas",
    "check_bool",
    "check_choice",
    "check_int",
    "check_interval",
    "check_nonnegative",
    "check_positive",
    "check_weight_decay_mode",
    "rule_keywords",
    "config_of_call",
]

_F = TypeVar("_F", bound=Callable[..., Any])


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {name}={value!r}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN; got {name}=nan")
    return value


def check_positive(name: str, value: Any) -> float:
    """A finite real number > 0."""
    v = _real(name, value)
    if not (0 < v < math.inf):
        raise ValueError(f"{name} must be a finite number > 0; got {name}={value!r}")
    return v


def check_nonnegative(name: str, value: Any) -> float:
    """A finite real number >= 0 (``lr`` of the torch optimizers, ``lam``, ``eps``, ...)."""
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
    if not any(value is c or (c is not None and value == c) for c in choices):
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


def check_bool(name: str, value: Any, *, allow_none: bool = False) -> bool | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        expected = "True, False or None" if allow_none else "True or False"
        raise TypeError(f"{name} must be {expected}; got {name}={value!r}")
    return value


def check_weight_decay_mode(value: Any, modes: tuple = WEIGHT_DECAY_MODES[:2]) -> str:
    return check_choice("weight_decay_mode", value, modes)


@dataclasses.dataclass(frozen=True)
class AMConfig:
    r"""The hyper-parameters of an AM beta rule, validated once.

    Parameters
    ----------
    lam : float
        Proximal regularisation :math:`\lambda \ge 0`.
    beta_max : float
        Cap of beta in :math:`[0, 1]` (:math:`\beta_{1,\max}` of AM-Adam, in ``[0, 1)``).
    numerator : {"exact", "linear"}
        The exact numerator needs f values (full batch); "linear" is the linearised one.
    per_layer : bool
        One beta per array (tensor) instead of one per parameter set (param group).
    variant : {None, "clip", "restart"}
        algorithms.md section 4; ``beta_min``, ``theta``, ``beta_high``, ``beta_low``
        (each in :math:`[0, 1]`) are its parameters.

    Examples
    --------
    >>> from amopt.core.config import AMConfig
    >>> AMConfig(lam=0.1, beta_max=0.9, variant="clip").beta_min
    0.5
    >>> AMConfig(lam=-1.0)
    Traceback (most recent call last):
    ...
    ValueError: lam must be a finite number >= 0; got lam=-1.0
    """

    lam: float = 0.0
    beta_max: float = 1.0
    numerator: str = "exact"
    per_layer: bool = False
    variant: str | None = None
    beta_min: float = 0.5
    theta: float = 0.7
    beta_high: float = 0.9
    beta_low: float = 0.1

    def __post_init__(self) -> None:
        values = {
            "lam": check_nonnegative("lam", self.lam),
            "beta_max": check_interval("beta_max", self.beta_max, 0.0, 1.0),
            "numerator": check_choice("numerator", self.numerator, NUMERATORS),
            "per_layer": check_bool("per_layer", self.per_layer),
            "variant": check_choice("variant", self.variant, VARIANTS),
        }
        for key in ("beta_min", "theta", "beta_high", "beta_low"):
            values[key] = check_interval(key, getattr(self, key), 0.0, 1.0)
        for key, value in values.items():
            object.__setattr__(self, key, value)

    @classmethod
    def cached(cls, **kwargs: Any) -> AMConfig:
        """The same as ``AMConfig(**kwargs)``, built (and validated) once per distinct value."""
        # the key holds the types too: 1 == True and 0.5 == Fraction(1, 2) must not share
        # an entry (a cached True would let per_layer=1 pass validation)
        key = tuple(sorted((k, type(v), v) for k, v in kwargs.items()))
        try:
            return _cached(cls, key)
        except TypeError:  # an unhashable value: validate it without the cache
            return cls(**kwargs)

    @classmethod
    def from_options(cls, options: dict[str, Any], **overrides: Any) -> AMConfig:
        """Build from a mapping that may hold other keys (a param group, ``locals()``).

        The fields found in ``options`` are taken, ``overrides`` replace them, and the
        configuration is built once per distinct value (:meth:`cached`).
        """
        names = [f.name for f in dataclasses.fields(cls)]
        values = {k: options[k] for k in names if k in options}
        values.update(overrides)
        return cls.cached(**values)


@functools.lru_cache(maxsize=256)
def _cached(cls: type[AMConfig], key: tuple) -> AMConfig:
    return cls(**{k: v for k, _, v in key})


def rule_keywords(*, omit: tuple[str, ...] = (), **defaults: Any) -> Callable[[_F], _F]:
    """Give ``fn(..., config=None, **rule)`` the options of the AM rule as keyword arguments.

    For the functions that take the rule's options one by one as well as a built
    ``config``: their signature (what ``help`` and :mod:`inspect` show) lists the
    fields of :class:`AMConfig` but ``omit``, with AMConfig's defaults or those given
    here, before ``config``; :func:`config_of_call` builds the configuration of a
    call. The options and their defaults are thus written once, in :class:`AMConfig`.
    """
    fields = [f for f in dataclasses.fields(AMConfig) if f.name not in omit]
    values = {f.name: defaults.pop(f.name, f.default) for f in fields}
    if defaults:
        raise TypeError(f"not options of the AM rule: {', '.join(defaults)}")

    def decorate(fn: _F) -> _F:
        sig = inspect.signature(fn)
        *head, config, _ = sig.parameters.values()
        kind = inspect.Parameter.KEYWORD_ONLY
        keywords = [
            inspect.Parameter(f.name, kind, default=values[f.name], annotation=f.type)
            for f in fields
        ]
        fn.__signature__ = sig.replace(parameters=[*head, *keywords, config])  # type: ignore[attr-defined]
        fn._rule_defaults = values  # type: ignore[attr-defined]
        return fn

    return decorate


def config_of_call(
    fn: Callable[..., Any], config: AMConfig | None, rule: dict[str, Any], **derived: Any
) -> AMConfig:
    """The configuration of a call of ``fn`` (made with :func:`rule_keywords`).

    ``config`` when given (it replaces the options), else the one of the options
    ``rule`` given to the call, the others at their defaults, and ``derived`` (those
    that come from other arguments, e.g. ``beta_max`` from ``betas``). A name that is
    not an option of ``fn`` is the ``TypeError`` Python raises for an unknown keyword.
    """
    defaults = fn._rule_defaults  # type: ignore[attr-defined]
    for name in rule:
        if name not in defaults:
            raise TypeError(f"{fn.__name__}() got an unexpected keyword argument {name!r}")
    if config is not None:
        return config
    return AMConfig.cached(**{**defaults, **rule, **derived})
