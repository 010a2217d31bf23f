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
}


def _triton_everywhere() -> list[bool]:
    """Make the default path the Triton one on CPU tensors; record, per call of the
    Triton driver, whether it combined sums across ranks."""
    os.environ["TRITON_INTERPRET"] = "1"
    from amopt.torch import _amadamw, _amsgd, _common
    from amopt.torch import _triton as tri

    original = _common.default_path

    def default_path(params, grads, *, fused, foreach):
        if fused or (fused is None and foreach is None):  # fused=True on the CPU here
            return "triton", None
        return original(params, grads, fused=fused, foreach=foreach)

    for module in (_common, _amsgd, _amadamw):
        module.default_path = default_path
    synced: list[bool] = []
    for name in ("triton_amsgd", "triton_am_adamw"):
        fn = getattr(tri, name)

        def spy(*args, _fn=fn, **kwargs):
            sync = kwargs.get("sync")
            synced.append(sync is not None and bool(sync.needs_collective))
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
                if name.startswith("fsdp2"):
                    model = _fsdp(_mlp(), mesh)
                    optimizer = OPTIMIZERS[opt](model.parameters(), **kw)
                    _train(model, optimizer, _rows(rank))
                else:
                    kind = _tp_kind(name)
                    model, forward = _shard_tp(_tp_model(kind), kind, mesh)
                    optimizer = OPTIMIZERS[opt](model.parameters(), **kw)
                    _train(model, optimizer, slice(0, BATCH), forward, outputs=2)
                betas = {
                    n: float(optimizer.state[p]["beta"])
                    for n, p in model.named_parameters()
                    if "beta" in optimizer.state.get(p, {})
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
        # every step ran the Triton driver with the sums combined across the ranks
        assert got["synced"] and all(got["synced"]), got["synced"]
        assert got["betas"].keys() == ref["betas"].keys()
        for key, beta in ref["betas"].items():
            assert got["betas"][key] == pytest.approx(beta, rel=1e-10, abs=1e-12), key
        for key, value in ref["params"].items():
            torch.testing.assert_close(got["params"][key], value, rtol=1e-10, atol=1e-12)
