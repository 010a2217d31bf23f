"""Pieces shared by the AM torch optimizers: validation, the beta rule, reductions.

Everything here works on tensors that stay on their device: the beta rule is
written with ``torch.where`` / ``torch.clamp`` so that no value is ever read
back to the host while an optimizer steps.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

__all__: list[str] = []

VARIANTS = (None, "clip", "restart")
#: Per-parameter state entries kept in the accumulation dtype (never cast to the param dtype).
SCALAR_STATE_KEYS = ("beta", "beta1_prod")


# --------------------------------------------------------------------------- validation


def _is_real_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_number(name: str, value: Any) -> float:
    """Reject tensors and non-numbers with a ``TypeError`` naming ``name``."""
    if isinstance(value, Tensor):
        raise TypeError(
            f"{name} must be a Python float, got a Tensor; tensor hyper-parameters "
            "are not supported by the AM optimizers"
        )
    if not _is_real_number(value):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    return float(value)


def check_nonnegative(name: str, value: Any) -> None:
    """``value >= 0`` (NaN fails), else ``ValueError`` naming the parameter and range."""
    v = check_number(name, value)
    if not v >= 0.0:
        raise ValueError(f"Invalid {name}: {value!r} (expected {name} >= 0)")


def check_unit_interval(name: str, value: Any, *, upper_open: bool = False) -> None:
    """``0 <= value <= 1`` (``< 1`` when ``upper_open``), else ``ValueError``."""
    v = check_number(name, value)
    ok = 0.0 <= v < 1.0 if upper_open else 0.0 <= v <= 1.0
    if not ok:
        upper = "< 1" if upper_open else "<= 1"
        raise ValueError(f"Invalid {name}: {value!r} (expected 0 <= {name} {upper})")


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"Invalid {name}: {value!r} (expected one of {allowed})")


def check_flag(name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, bool):
        expected = "True, False or None" if allow_none else "True or False"
        raise ValueError(f"Invalid {name}: {value!r} (expected {expected})")


def check_variant_options(group: dict[str, Any]) -> None:
    """The section-4 variant and its four parameters."""
    check_choice("variant", group["variant"], VARIANTS)
    for key in ("beta_min", "theta", "beta_high", "beta_low"):
        check_unit_interval(key, group[key])


# --------------------------------------------------------------------------- dtypes, steps


def accumulation_dtype(dtypes: Iterable[torch.dtype]) -> torch.dtype:
    """float64 if any of ``dtypes`` is float64, else float32 (half precision is promoted)."""
    return torch.float64 if any(dt == torch.float64 for dt in dtypes) else torch.float32


def real_dtype(t: Tensor) -> torch.dtype:
    """The dtype of ``t`` seen as real numbers (``complex128 -> float64``)."""
    return t.real.dtype if torch.is_complex(t) else t.dtype


def new_step() -> Tensor:
    """A fresh step counter: a 0-d tensor on the CPU, as in ``torch.optim.Adam``."""
    dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    return torch.zeros((), dtype=dtype)


def as_real(t: Tensor) -> Tensor:
    return torch.view_as_real(t) if torch.is_complex(t) else t


def cast(tensors: Sequence[Tensor], dtype: torch.dtype) -> list[Tensor]:
    """``tensors`` in ``dtype``; no copy for those already in it."""
    return [t if t.dtype == dtype else t.to(dtype) for t in tensors]


# --------------------------------------------------------------------------- reductions


def dot(a: Tensor, b: Tensor, acc: torch.dtype) -> Tensor:
    """``sum(a * b)`` over every coordinate, accumulated in ``acc`` (0-d tensor)."""
    return torch.sum(a.to(acc) * b.to(acc))


def _foreach_powsum(
    tensors: Sequence[Tensor], order: int, dtype: torch.dtype | None = None
) -> list[Tensor]:
    """``[sum(|t|**order) for t in tensors]``: ``torch._foreach_powsum`` where it exists.

    Older torch releases lack it; there ``_foreach_norm`` is used, raised back
    to the power ``order`` (a relative difference of a few ulps for ``order=2``).
    """
    powsum = getattr(torch, "_foreach_powsum", None)
    if powsum is not None:
        return list(powsum(tensors, order, dtype=dtype))
    norms = torch._foreach_norm(tensors, order, dtype=dtype)
    return list(norms) if order == 1 else list(torch._foreach_pow(norms, order))


def foreach_sqsum(tensors: Sequence[Tensor], acc: torch.dtype) -> list[Tensor]:
    """``[sum(t * t) for t in tensors]`` with one multi-tensor kernel, accumulated in ``acc``."""
    return _foreach_powsum(tensors, 2, dtype=acc)


def foreach_abssum(tensors: Sequence[Tensor]) -> list[Tensor]:
    """``[sum(|t|) for t in tensors]`` (the plain sum for non-negative tensors)."""
    return _foreach_powsum(tensors, 1)


def foreach_sum(tensors: Sequence[Tensor]) -> list[Tensor]:
    """``[sum(t) for t in tensors]`` for signed tensors, with multi-tensor kernels.

    There is no ``_foreach_sum``; the sum is taken as (sum of the positive
    parts) - (sum of the magnitudes of the negative parts).
    """
    pos = _foreach_powsum(torch._foreach_clamp_min(tensors, 0.0), 1)
    neg = _foreach_powsum(torch._foreach_clamp_max(tensors, 0.0), 1)
    return list(torch._foreach_sub(pos, neg))


def bias_corrections(steps: Sequence[Tensor], beta2: float) -> list[Tensor]:
    """``[1 - beta2**step for step in steps]`` as CPU float64 0-d tensors.

    The step counters live on the CPU, so this never touches the device; the
    0-d results act as scalars in the device kernels that use them.
    """
    s = torch.stack(list(steps)).to(torch.float64)
    return list((1.0 - torch.pow(beta2, s)).unbind())


def total(parts: Sequence[Tensor]) -> Tensor:
    """Sum of 0-d partial reductions (moved to the device of the first one)."""
    device = parts[0].device
    if len(parts) == 1:
        return parts[0]
    return torch.stack([p.to(device, non_blocking=True) for p in parts]).sum()


# --------------------------------------------------------------------------- the beta rule


def guarded_beta(num: Tensor, den: Tensor, ref: Tensor, beta_max: float) -> Tensor:
    r"""Step 4 of algorithms.md, elementwise over tensors of betas.

    ``clip(num / den, 0, beta_max)``, and ``0`` where ``den <= tiny * ref``
    (``tiny = eps(dtype)**2``) or where the ratio is NaN (overflowing
    reductions). Written with ``torch.where`` so that nothing is read on the host.
    """
    tiny = torch.finfo(den.dtype).eps ** 2
    degenerate = den <= tiny * ref
    safe_den = torch.where(degenerate, torch.ones_like(den), den)
    ratio = num / safe_den
    ratio = torch.where(torch.isnan(ratio), torch.zeros_like(ratio), ratio)
    beta = torch.clamp(ratio, 0.0, float(beta_max))
    return torch.where(degenerate, torch.zeros_like(beta), beta)


def apply_variant(
    beta: Tensor,
    variant: str | None,
    beta_min: float,
    theta: float,
    beta_high: float,
    beta_low: float,
) -> Tensor:
    """Section 4: ``clip`` raises beta to ``beta_min``; ``restart`` picks high/low at ``theta``."""
    if variant is None:
        return beta
    if variant == "clip":
        return torch.clamp(beta, min=float(beta_min))
    if variant == "restart":
        high = torch.full_like(beta, float(beta_high))
        low = torch.full_like(beta, float(beta_low))
        return torch.where(beta >= theta, high, low)
    raise ValueError(f"Invalid variant: {variant!r} (expected one of None, 'clip', 'restart')")


# --------------------------------------------------------------------------- optimizer base


class AMOptimizerBase(Optimizer):
    """Telemetry and state-dict handling shared by the AM optimizers."""

    def latest_betas(self) -> list[list[Tensor | None]]:
        """The beta applied at the latest step, per param group and parameter.

        Returns one list per param group, aligned with ``group["params"]``:
        the 0-d tensor (accumulation dtype, on the device where it was
        computed) last applied to that parameter, or ``None`` before the
        parameter's first step. In a global-scope group (``per_layer=False``)
        every entry is the group's single beta. The tensors are the ones held in
        ``optimizer.state[p]["beta"]``: no copy, no kernel and no device
        synchronisation, so this is cheap enough to log every step (call
        ``.item()`` or ``torch.stack(...).tolist()`` when you want host values).
        """
        return [
            [
                self.state[p]["beta"] if "beta" in self.state.get(p, {}) else None
                for p in g["params"]
            ]
            for g in self.param_groups
        ]

    def _share_group_state(self, group: dict[str, Any], **entries: Tensor) -> None:
        """Store group-level state (a global scope's beta) on every stepped member."""
        for p in group["params"]:
            state = self.state.get(p)
            if state:
                state.update(entries)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict; ``beta`` / ``beta1_prod`` keep their accumulation dtype.

        ``torch.optim.Optimizer.load_state_dict`` casts every floating state
        tensor to its parameter's dtype; for the 0-d beta entries of bf16/fp16
        parameters (and float32 parameters of a float64 global scope) that would
        lose precision, so they are restored with their saved dtype, on the
        parameter's device. Step counters are kept on the CPU.
        """
        super().load_state_dict(state_dict)
        saved_ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        for saved_id, p in zip(saved_ids, params, strict=True):
            saved = state_dict["state"].get(saved_id)
            if not saved or p not in self.state:
                continue
            state = self.state[p]
            for key in SCALAR_STATE_KEYS:
                value = saved.get(key)
                if isinstance(value, Tensor):
                    state[key] = value.to(device=p.device)
            step = state.get("step")
            if isinstance(step, Tensor) and step.device.type != "cpu":
                state["step"] = step.to("cpu")

    def _backfill_steps(self) -> None:
        """Older states may hold Python-number steps: make them CPU tensors."""
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p)
                if state and "step" in state and not torch.is_tensor(state["step"]):
                    step = new_step()
                    step.fill_(float(state["step"]))
                    state["step"] = step
