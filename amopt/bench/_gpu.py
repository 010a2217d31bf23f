"""GPU rows of ``python -m amopt.bench``: AM-AdamW on the Triton kernels against fused AdamW.

Each row times one optimizer step on bfloat16 parameters of a real model's
shapes, interleaved with ``torch.optim.AdamW(fused=True)`` on identical
parameters and gradients (median of the paired ratios, as every other row):

* ``gpu-gpt2``: GPT-2 small, 124M parameters in 148 tensors;
* ``gpu-1b``: a 1.2B-parameter decoder (Llama-3.2-1B shapes), 146 tensors.

The AM side is :func:`amopt.torch._triton.triton_am_adamw` on the group's
lists (per-layer beta, decoupled weight decay, the optimizers' defaults);
``torch.optim.AdamW(fused=True).step()`` on the other side. Each sample is one
step followed by ``torch.cuda.synchronize()``. Without a CUDA device (or
without Triton) the rows are skipped and say why ("no GPU: ...").

Examples
--------
>>> import math
>>> from amopt.bench._gpu import gpt2_small_shapes
>>> sum(math.prod(s) for s in gpt2_small_shapes())
124439808
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from amopt.bench import cases
from amopt.bench._records import Measured, Row
from amopt.bench._timing import interleave
from amopt.bench.cases import gpt2_small_shapes, llama_1b_shapes

__all__ = ["GpuAdamCase", "gpt2_small_shapes", "gpu_rows", "llama_1b_shapes"]


def _quick(shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The same tensor count with every dimension divided by 16 (a smoke test)."""
    return [tuple(max(1, n // 16) for n in s) for s in shapes]


def _require_gpu() -> None:
    try:
        import torch
    except ImportError:
        raise cases.SkipCase("no GPU: torch is not installed") from None
    if not torch.cuda.is_available():
        raise cases.SkipCase("no GPU: torch.cuda.is_available() is False")
    from amopt.torch._triton import available

    reason = available([torch.zeros(1, device="cuda", dtype=torch.bfloat16)])
    if reason is not None:
        raise cases.SkipCase(f"no GPU kernels: {reason}")


class GpuAdamCase:
    """One optimizer step over bfloat16 parameters of ``shapes`` on the GPU, fixed gradients.

    Parameters
    ----------
    kind : {"am_adamw_triton", "adamw_fused"}
        :func:`~amopt.torch._triton.triton_am_adamw` (per-layer beta, decoupled
        decay) or ``torch.optim.AdamW(fused=True)``.
    shapes : list of tuple of int
    seed : int
        Seed of the parameter and gradient values (the same for both kinds).
    """

    def __init__(self, kind: str, shapes: list[tuple[int, ...]], seed: int = 0) -> None:
        import torch

        from amopt._config import AMConfig
        from amopt.torch._common import AdamHyper, AdamTensors
        from amopt.torch._triton import triton_am_adamw

        if kind not in ("am_adamw_triton", "adamw_fused"):
            raise ValueError(f"unknown kind {kind!r}; expected 'am_adamw_triton' or 'adamw_fused'")
        _require_gpu()
        gen = torch.Generator(device="cuda").manual_seed(seed)
        dtype = torch.bfloat16
        self.params = [
            torch.nn.Parameter(torch.randn(s, generator=gen, device="cuda", dtype=dtype))
            for s in shapes
        ]
        for p in self.params:
            p.grad = 1e-2 * torch.randn(p.shape, generator=gen, device="cuda", dtype=dtype)
        self.n_params = sum(p.numel() for p in self.params)
        self.kind = kind
        if kind == "adamw_fused":
            self.optimizer = torch.optim.AdamW(self.params, lr=1e-3, weight_decay=1e-2, fused=True)
            self._step: Callable[[], Any] = self.optimizer.step
        else:
            lists: dict[str, Any] = {
                "params": self.params,
                "grads": [p.grad for p in self.params],
                "exp_avgs": [torch.zeros_like(p) for p in self.params],
                "exp_avg_sqs": [torch.zeros_like(p) for p in self.params],
                "state_steps": [torch.zeros(()) for _ in self.params],
                "beta1_prods": [torch.ones((), device="cuda") for _ in self.params],
            }
            config = AMConfig.cached(lam=0.1, beta_max=0.9, numerator="linear", per_layer=True)
            hyper = AdamHyper(
                lr=1e-3,
                beta2=0.999,
                eps=1e-8,
                weight_decay=1e-2,
                weight_decay_mode="decoupled",
                maximize=False,
                config=config,
            )

            def step() -> None:
                with torch.no_grad():
                    _, lists["beta1_prods"] = triton_am_adamw(AdamTensors(**lists), hyper)

            self._step = step

    def run(self) -> None:
        import torch

        self._step()
        torch.cuda.synchronize()


def _measure(shapes_of: Callable[[], list[tuple[int, ...]]]) -> Callable[[Any], Any]:
    def measure(settings: Any) -> Any:
        import torch

        _require_gpu()
        shapes = _quick(shapes_of()) if settings.quick else shapes_of()
        a = GpuAdamCase("am_adamw_triton", shapes)
        b = GpuAdamCase("adamw_fused", shapes)
        paired = interleave(a.run, b.run, repeat=settings.repeat, warmup=3)
        note = (
            f"{a.n_params:,} bf16 params in {len(shapes)} tensors, per-layer beta; "
            f"{torch.cuda.get_device_name()}"
        )
        return Measured.from_paired(paired, scale=1e3, unit="ms", note=note)

    return measure


def gpu_rows() -> tuple[Any, ...]:
    """The GPU rows, as :class:`amopt.bench.Row` objects (informational: no target yet)."""
    return (
        Row(
            "gpu-gpt2",
            "AMAdamW(triton) step / AdamW(fused=True) step, GPT-2 small (124M bf16 params)",
            "AMAdamW(triton)",
            "AdamW(fused=True)",
            None,
            _measure(gpt2_small_shapes),
        ),
        Row(
            "gpu-1b",
            "AMAdamW(triton) step / AdamW(fused=True) step, 1.2B bf16 params (Llama-3.2-1B)",
            "AMAdamW(triton)",
            "AdamW(fused=True)",
            None,
            _measure(llama_1b_shapes),
        ),
    )


ROWS: tuple = ()
