"""The Triton step on sharded scopes: FSDP2 and tensor parallel, two gloo ranks.

Each rank runs the Triton kernels (in Triton's interpreter, on CPU tensors: the
optimizers are made to choose the Triton path as they do on CUDA) on its local
pieces, and the packed all-reduce of ``amopt.torch._distributed`` adds the sums of
each sharded scope between the kernels' reduce and the rule. The reference is the
same training in one process on the whole batch with plain tensors and the
single-tensor path: same betas and parameters, to the float64 rounding of sums
added in another order.
"""

from __future__ import annotations

import os
import traceback

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
import torch.distributed as dist  # noqa: E402
from _gloo import exit_without_teardown, init_rank, spawn  # noqa: E402
from test_torch_distributed import (  # noqa: E402
    BATCH,
    HYPER,
    N_STEPS,
    OPTIMIZERS,
    _fsdp,
    _full_params,
    _mlp,
    _rows,
    _shard_tp,
    _tp_kind,
    _tp_model,
    _train,
)

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this torch build",
)

WORLD_SIZE = 2
TIMEOUT_S = 240
CONFIGS = {
    "fsdp2-AMAdamW-layer": ("AMAdamW", {"per_layer": True}),
    "fsdp2-AMAdamW-global": ("AMAdamW", {"per_layer": False}),
    "fsdp2-AMSGD-layer": ("AMSGD", {"per_layer": True}),
    "fsdp2-AMSGD-global": ("AMSGD", {"per_layer": False}),
    "tp-AMAdamW-layer": ("AMAdamW", {"per_layer": True}),
    "tp-nobias-AMSGD-global": ("AMSGD", {"per_layer": False}),
    # plain tensors, each rank stepping its partition: the global scope combined over the
    # process group that ZeroRedundancyOptimizer uses
    "zero-AMAdamW-global": ("AMAdamW", {"per_layer": False}),
    "zero-AMSGD-global": ("AMSGD", {"per_layer": False}),
}


_HELD: list = []


def _triton_everywhere() -> list[tuple[bool, bool]]:
    """Make the default path the Triton one on CPU tensors; record, per call of the
    Triton driver, whether it combined sums across ranks and whether it ran on the
    group's plan (the optimizers' planned step)."""
    from amopt.torch import _triton as tri
    from benchmarks.host import triton_on_cpu

    # for the rest of this process (held: a collected context manager would undo itself)
    _HELD.append(triton_on_cpu(stub=False))
    _HELD[-1].__enter__()
    synced: list[tuple[bool, bool]] = []
    for name in ("triton_amsgd", "triton_am_adamw"):
        fn = getattr(tri, name)

        def spy(*args, _fn=fn, **kwargs):
            sync = kwargs.get("sync")
            combined = sync is not None and bool(sync.needs_collective)
            synced.append((combined, kwargs.get("plan") is not None))
            return _fn(*args, **kwargs)

        setattr(tri, name, spy)
    return synced


def _worker(rank: int, port: int, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    init_rank(rank, port, WORLD_SIZE)
    synced = _triton_everywhere()
    results: dict = {}
    try:
        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        for name, (opt, kw) in CONFIGS.items():
            del synced[:]
            try:
                local = None
                if name.startswith("fsdp2"):
                    model = _fsdp(_mlp(), mesh)
                    optimizer = OPTIMIZERS[opt](model.parameters(), **kw)
                    _train(model, optimizer, _rows(rank))
                elif name.startswith("zero"):
                    from torch.distributed.optim import ZeroRedundancyOptimizer

                    model = _mlp()
                    ddp = torch.nn.parallel.DistributedDataParallel(model)
                    cls, hyper = HYPER[opt]
                    optimizer = ZeroRedundancyOptimizer(
                        model.parameters(), optimizer_class=cls, **{**hyper, **kw}
                    )
                    _train(model, optimizer, _rows(rank), ddp)
                    local = optimizer.optim
                else:
                    kind = _tp_kind(name)
                    model, forward = _shard_tp(_tp_model(kind), kind, mesh)
                    optimizer = OPTIMIZERS[opt](model.parameters(), **kw)
                    _train(model, optimizer, slice(0, BATCH), forward, outputs=2)
                state = (local or optimizer).state
                betas = {
                    n: float(state[p]["beta"])
                    for n, p in model.named_parameters()
                    if "beta" in state.get(p, {})
                }
                res = {"params": _full_params(model), "betas": betas, "synced": list(synced)}
            except Exception:  # reported by the test of this configuration
                res = {"error": traceback.format_exc()}
            results[name] = res
        dist.barrier()
    finally:
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()
    exit_without_teardown()


@pytest.fixture(scope="module")
def ranks():
    return spawn(_worker, WORLD_SIZE, TIMEOUT_S)


def _reference(name: str) -> dict:
    opt, kw = CONFIGS[name]
    if name.startswith("tp"):
        model, outputs = _tp_model(_tp_kind(name)), 2
    else:
        model, outputs = _mlp(), 1
    optimizer = OPTIMIZERS[opt](model.parameters(), **kw, foreach=False)
    _train(model, optimizer, slice(0, BATCH), outputs=outputs)
    betas = {n: float(optimizer.state[p]["beta"]) for n, p in model.named_parameters()}
    return {"params": _full_params(model), "betas": betas}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_triton_step_on_sharded_scopes_matches_one_process(ranks, name):
    ref = _reference(name)
    for rank, result in enumerate(ranks):
        assert "error" not in result[name], f"rank {rank}:\n{result[name]['error']}"
        got = result[name]
        # every step ran the Triton driver with the sums combined across the ranks, and
        # every step after the first on the group's plan (no per-tensor work per step)
        calls = got["synced"]
        assert len(calls) == N_STEPS, calls
        assert all(combined for combined, _ in calls), calls
        assert [planned for _, planned in calls] == [False] + [True] * (N_STEPS - 1), calls
        if name.startswith("zero"):  # each rank holds the state of its partition
            assert got["betas"] and got["betas"].keys() <= ref["betas"].keys()
        else:
            assert got["betas"].keys() == ref["betas"].keys()
        for key, beta in got["betas"].items():
            assert beta == pytest.approx(ref["betas"][key], rel=1e-10, abs=1e-12), key
        for key, value in ref["params"].items():
            torch.testing.assert_close(got["params"][key], value, rtol=1e-10, atol=1e-12)
