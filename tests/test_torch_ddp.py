"""DistributedDataParallel: two ``gloo`` ranks on the CPU == one process on the whole batch.

DDP all-reduces (averages) the gradients, so every rank computes the same beta
and takes the same step; that step must equal the single-process step on the
concatenated batch.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from _gloo import exit_without_teardown, init_rank, spawn  # noqa: E402

from amopt.torch import AMSGD, AMAdamW  # noqa: E402

WORLD_SIZE = 2
N_STEPS = 8
BATCH = 32

OPTIMIZERS = {
    "AMSGD": lambda params: AMSGD(params, lr=0.1, lam=0.1, beta_max=0.9),
    "AMSGD-per-layer-foreach": lambda params: AMSGD(
        params, lr=0.1, per_layer=True, weight_decay=1e-3, foreach=True
    ),
    "AMAdamW": lambda params: AMAdamW(params, lr=1e-2, weight_decay=0.05),
    "AMAdamW-global-proximal": lambda params: AMAdamW(
        params, lr=1e-2, per_layer=False, weight_decay_mode="proximal", weight_decay=0.1
    ),
}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    ).double()


def _batch(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + t)
    X = torch.randn(BATCH, 6, generator=g, dtype=torch.float64)
    y = torch.sin(X.sum(dim=1, keepdim=True)) + 0.1 * torch.randn(
        BATCH, 1, generator=g, dtype=torch.float64
    )
    return X, y


def _train(model, optimizer, rows: slice, step_model=None) -> list[list[float]]:
    forward = step_model if step_model is not None else model
    betas = []
    for t in range(N_STEPS):
        X, y = _batch(t)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(forward(X[rows]), y[rows]).backward()
        optimizer.step()
        betas.append([float(b) for b in optimizer.latest_betas()[0]])
    return betas


def _worker(rank: int, port: int, out_dir: str) -> None:
    init_rank(rank, port, WORLD_SIZE)
    try:
        results = {}
        rows = slice(rank * BATCH // WORLD_SIZE, (rank + 1) * BATCH // WORLD_SIZE)
        for name, make in OPTIMIZERS.items():
            model = _model()
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            betas = _train(model, make(ddp.parameters()), rows, step_model=ddp)
            results[name] = {
                "params": [p.detach().clone() for p in model.parameters()],
                "betas": betas,
            }
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears gloo down while the other still talks to it
    finally:
        dist.destroy_process_group()
    exit_without_teardown()


@pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this torch build",
)
def test_ddp_two_gloo_ranks_match_single_process():
    ranks = spawn(_worker, WORLD_SIZE, 120)

    for name, make in OPTIMIZERS.items():
        model = _model()
        betas = _train(model, make(model.parameters()), slice(0, BATCH))
        for rank_result in ranks:
            got = rank_result[name]
            np.testing.assert_allclose(got["betas"], betas, rtol=1e-12, atol=1e-13, err_msg=name)
            for p, q in zip(got["params"], model.parameters(), strict=True):
                torch.testing.assert_close(p, q.detach(), rtol=1e-12, atol=1e-13, msg=name)
        # the ranks agree with each other exactly: same all-reduced gradients, same beta
        for p, q in zip(ranks[0][name]["params"], ranks[1][name]["params"], strict=True):
            assert torch.equal(p, q), name
        interior = [b for step in betas for b in step if 0.0 < b < 0.9 - 1e-9]
        assert interior, f"{name}: beta never left its bounds, the test would be weak"
