r"""Records shared by every implementation of the AM optimizers' steps.

The bottom of ``amopt.torch``: the lists and hyper-parameters a step takes, the
gradient scaler's protocol and the dtype rules. The drivers (``_fused``, ``_triton``,
``_fused_ops``) and the optimizer classes import them from here; nothing here imports
another module of the package.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import torch
from torch import Tensor

from amopt._config import AMConfig

__all__ = [
    "NO_SCALER",
    "AdamHyper",
    "AdamTensors",
    "FusedFallbackWarning",
    "SGDHyper",
    "SGDTensors",
    "Scaler",
    "accumulation_dtype",
    "as_real",
    "real_dtype",
]


class FusedFallbackWarning(UserWarning):
    """``fused=True`` could not use the fused kernels; the foreach implementation ran instead."""


class SGDTensors(NamedTuple):
    """The lists an AMSGD step reads and updates, aligned by parameter."""

    params: list[Tensor]
    grads: list[Tensor]
    momentum_buffer_list: list[Tensor | None]
    state_steps: list[Tensor]


class SGDHyper(NamedTuple):
    """The hyper-parameters every implementation of an AMSGD step takes."""

    lr: float
    weight_decay: float
    maximize: bool
    config: AMConfig


class AdamTensors(NamedTuple):
    """The lists an AM-Adam(W) step reads and updates, aligned by parameter."""

    params: list[Tensor]
    grads: list[Tensor]
    exp_avgs: list[Tensor]
    exp_avg_sqs: list[Tensor]
    state_steps: list[Tensor]
    beta1_prods: list[Tensor]


class AdamHyper(NamedTuple):
    """The hyper-parameters every implementation of an AM-Adam(W) step takes."""

    lr: float
    beta2: float
    eps: float
    weight_decay: float
    weight_decay_mode: str
    maximize: bool
    config: AMConfig


class Scaler(NamedTuple):
    """``torch.amp.GradScaler``'s fused protocol: gradients times ``grad_scale``; skip
    the step where ``found_inf`` is non-zero."""

    grad_scale: Tensor | None = None
    found_inf: Tensor | None = None


#: No gradient scaler.
NO_SCALER = Scaler()


def accumulation_dtype(dtypes: Iterable[torch.dtype]) -> torch.dtype:
    """float64 if any of ``dtypes`` is float64, else float32 (half precision is promoted)."""
    return torch.float64 if any(dt == torch.float64 for dt in dtypes) else torch.float32


def real_dtype(t: Tensor) -> torch.dtype:
    """The dtype of ``t`` seen as real numbers (``complex128 -> float64``)."""
    return t.real.dtype if torch.is_complex(t) else t.dtype


def as_real(t: Tensor) -> Tensor:
    return torch.view_as_real(t) if torch.is_complex(t) else t
