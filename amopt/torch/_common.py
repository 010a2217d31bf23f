"""Pieces shared by the AM torch optimizers: validation, dtypes, reductions, the base class.

The beta rules themselves live in :mod:`amopt._rule` (one implementation for every
surface); everything here works on tensors that stay on their device, so that no
value is read back to the host while an optimizer steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from amopt._config import check_bool, check_nonnegative

__all__: list[str] = []

#: Per-parameter state entries kept in the accumulation dtype (never cast to the param dtype).
SCALAR_STATE_KEYS = ("beta", "beta1_prod")


# --------------------------------------------------------------------------- validation


def check_lr(value: Any) -> float:
    """``lr``: a finite real number >= 0 (the messages of :mod:`amopt._config`)."""
    if isinstance(value, Tensor):
        raise TypeError(
            f"lr must be a Python float; got a Tensor (lr={value!r}); tensor learning "
            "rates are not supported by the AM optimizers"
        )
    return check_nonnegative("lr", value)


def check_group_flags(group: dict[str, Any], nonnegative: Sequence[str] = ()) -> None:
    """The hyper-parameters every AM param group has besides its rule's configuration."""
    for key in nonnegative:
        check_nonnegative(key, group[key])
    check_bool("maximize", group["maximize"])
    check_bool("foreach", group["foreach"], allow_none=True)
    check_bool("fused", group["fused"], allow_none=True)
    if group["fused"] and group["foreach"]:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")


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


def rule_by_rows(rule: Any, rows: Sequence[Tensor], *args: Any, **kwargs: Any) -> Any:
    """``rule(torch, stacked rows, ...)``; row by row when scopes differ in accumulation dtype.

    A per-layer group mixing float64 and float32 tensors keeps each scope's beta in its
    own accumulation dtype (stacking would promote every row to float64).
    """
    if all(r.dtype == rows[0].dtype for r in rows):
        return rule(torch, torch.stack(list(rows)), *args, **kwargs)
    outs = [rule(torch, r, *args, **kwargs) for r in rows]
    if isinstance(outs[0], tuple):
        return tuple(list(col) for col in zip(*outs, strict=True))
    return outs


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
