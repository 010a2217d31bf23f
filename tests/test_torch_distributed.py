"""Sharded parameters: two ``gloo`` ranks on the CPU == one process, for every layout.

A rank that holds a piece of a beta scope must get the beta of the whole scope.
One spawned job (two ranks) trains every configuration below for a few steps:
FSDP2 (``fully_shard``), ``ZeroRedundancyOptimizer``, a hand-made partition,
DistributedDataParallel and a tensor-parallel MLP with DTensor weights sharded
as ``Shard(0)`` and ``Shard(1)``. The parent process trains the same model in a
single process on the same data; parameters and betas must agree. The job also
saves and resumes an FSDP2 run through ``torch.distributed.checkpoint`` and
collects the error messages of the layouts that are rejected.
"""

from __future__ import annotations

import io
import os
import time
import traceback
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from _gloo import exit_without_teardown, init_rank, spawn  # noqa: E402
from torch import nn  # noqa: E402

from amopt.torch import AMSGD, AMAdam, AMAdamW  # noqa: E402
from amopt.torch._distributed import comm_stats  # noqa: E402
from amopt.torch._fused import fused_status  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this torch build",
)

WORLD_SIZE = 2
N_STEPS = 6
BATCH = 16
TIMEOUT_S = 150

HYPER = {
    "AMSGD": (AMSGD, {"lr": 0.05, "weight_decay": 1e-3}),
    "AMAdamW": (AMAdamW, {"lr": 1e-2, "weight_decay": 0.05}),
    "AMAdam": (AMAdam, {"lr": 1e-2, "weight_decay": 1e-3}),
}
OPTIMIZERS = {
    name: (lambda params, cls=cls, hyper=hyper, **kw: cls(params, **{**hyper, **kw}))
    for name, (cls, hyper) in HYPER.items()
}
# per configuration: (optimizer, its keyword arguments); the layout is in the name
FSDP = {
    f"fsdp2-{opt}-{scope}-{path}": (
        opt,
        {"per_layer": scope == "layer", "foreach": path == "foreach"},
    )
    for opt in OPTIMIZERS
    for scope in ("layer", "global")
    for path in ("single", "foreach")
}
FSDP["fsdp2-AMAdamW-layer-foreach-float32"] = ("AMAdamW", {"per_layer": True, "foreach": True})
FSDP["fsdp2-AMAdamW-layer-fused"] = ("AMAdamW", {"per_layer": True, "fused": True})
# a float32 layer between float64 ones: two foreach buckets whose scopes interleave
FSDP["fsdp2-AMSGD-layer-foreach-mixed"] = ("AMSGD", {"per_layer": True, "foreach": True})
FSDP["fsdp2-AMAdamW-global-foreach-mixed"] = ("AMAdamW", {"per_layer": False, "foreach": True})
ZERO = {
    "zero-AMAdamW-layer": ("AMAdamW", {"per_layer": True}),
    "zero-AMAdamW-global": ("AMAdamW", {"per_layer": False}),
    "zero-AMSGD-global-foreach": ("AMSGD", {"per_layer": False, "foreach": True}),
    "zero-AMSGD-global-two-groups": ("AMSGD", {"per_layer": False}),
}
TP = {
    f"tp-{opt}-layer-{path}": (opt, {"per_layer": True, "foreach": path == "foreach"})
    for opt in ("AMSGD", "AMAdamW")
    for path in ("single", "foreach")
}
# a global Adam scope needs a larger step to move beta off its cap within N_STEPS
TP["tp-nobias-AMAdamW-global-foreach"] = (
    "AMAdamW",
    {"per_layer": False, "foreach": True, "lr": 0.2},
)
TP["tp-nobias-AMSGD-global-single"] = ("AMSGD", {"per_layer": False, "foreach": False})
OTHER = {
    "partition-AMSGD-global-process-group": ("AMSGD", {"per_layer": False}),
    "ddp-AMSGD-global": ("AMSGD", {"per_layer": False}),
}
# four ranks on a 2 x 2 mesh ("dp", "tp"): FSDP x TP (Megatron MLP, fully_shard over "dp")
# and HSDP (fully_shard over the whole mesh: Replicate() on "dp", Shard(0) on "tp")
MESH_2D = {
    "fsdp-x-tp-AMAdamW-layer-foreach": ("AMAdamW", {"per_layer": True, "foreach": True}),
    "fsdp-x-tp-AMSGD-layer-single": ("AMSGD", {"per_layer": True, "foreach": False}),
    "hsdp-AMAdamW-layer-single": ("AMAdamW", {"per_layer": True, "foreach": False}),
    "hsdp-AMSGD-global-foreach": ("AMSGD", {"per_layer": False, "foreach": True}),
}
TWO_RANKS = {**FSDP, **ZERO, **TP, **OTHER}
CONFIGS = {**TWO_RANKS, **MESH_2D}


# --------------------------------------------------------------------------- models, data


class _Cast(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)


def _mlp(dtype: torch.dtype = torch.float64, mixed: bool = False) -> nn.Module:
    # 16, 3 and 1 output rows: even shards, uneven ones and an empty shard on rank 1
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3), nn.Tanh(), nn.Linear(3, 1)
    ).to(dtype)
    if mixed:  # the middle layer in float32
        model[2].float()
        model.insert(2, _Cast(torch.float32))
        model.insert(4, _Cast(dtype))
    return model


def _batch(t: int, dtype: torch.dtype = torch.float64, outputs: int = 1):
    g = torch.Generator().manual_seed(1000 + t)
    X = torch.randn(BATCH, 6, generator=g, dtype=torch.float64)
    y = torch.sin(X[:, :outputs] + X.sum(dim=1, keepdim=True)) + 0.1 * torch.randn(
        BATCH, outputs, generator=g, dtype=torch.float64
    )
    return X.to(dtype), y.to(dtype)


def _rows(rank: int) -> slice:
    return slice(rank * BATCH // WORLD_SIZE, (rank + 1) * BATCH // WORLD_SIZE)


def _betas(optimizer, names: dict) -> dict[str, float]:
    """Latest beta of every parameter this rank's optimizer steps, by parameter name."""
    return {
        names[p]: float(optimizer.state[p]["beta"])
        for group in optimizer.param_groups
        for p in group["params"]
        if "beta" in optimizer.state.get(p, {})
    }


def _train(
    model, optimizer, rows: slice, forward=None, dtype=torch.float64, outputs=1, after_step=None
):
    forward = forward or model
    names = {p: n for n, p in model.named_parameters()}
    local = optimizer.optim if hasattr(optimizer, "optim") else optimizer  # ZeRO
    betas = []
    for t in range(N_STEPS):
        X, y = _batch(t, dtype, outputs)
        model.zero_grad()  # a rank's optimizer may hold only part of the model
        out = forward(X[rows])
        if hasattr(out, "full_tensor"):
            out = out.full_tensor()
        nn.functional.mse_loss(out, y[rows]).backward()
        optimizer.step()
        if after_step is not None:
            after_step()
        betas.append(_betas(local, names))
    return betas


def _combined_sums(model) -> dict[str, bool]:
    """The combined sums of each scope equal the sums over the full tensors, numel included.

    The beta is invariant to scaling all sums of a scope, so a scope counted twice (summed
    over ranks that hold replicas) leaves the betas unchanged: it is checked here directly,
    for per-layer scopes (as one (k,) row per tensor and as two interleaved (m, k)
    entries, as the foreach buckets pass them) and for the global scope.
    """
    from amopt.torch._distributed import localize, sync_sums

    params = [p for p in model.parameters() if p.grad is not None]

    def rows(ps, gs):
        return [
            torch.stack(
                [(g.double() ** 2).sum(), (p.double() ** 2).sum(), torch.tensor(g.numel())]
            ).to(torch.float64)
            for p, g in zip(ps, gs, strict=True)
        ]

    full = rows([p.full_tensor() for p in params], [p.grad.full_tensor() for p in params])
    out = {}
    local_params, local_grads, sync = localize(params, [p.grad for p in params], per_layer=True)
    local = rows(local_params, local_grads)
    got = sync_sums(sync, local)
    out["per-layer"] = all(
        torch.allclose(a, b, rtol=1e-12) for a, b in zip(got, full, strict=True)
    )
    odd, even = list(range(1, len(params), 2)), list(range(0, len(params), 2))
    buckets = [torch.stack([local[i] for i in odd]), torch.stack([local[i] for i in even])]
    got = sync_sums(sync, buckets, [odd, even])
    out["buckets"] = all(
        torch.allclose(got[b][r], full[i], rtol=1e-12)
        for b, idx in enumerate((odd, even))
        for r, i in enumerate(idx)
    )
    try:
        local_params, local_grads, sync = localize(
            params, [p.grad for p in params], per_layer=False
        )
    except ValueError:  # a mixed layout: no global scope
        return out
    (got,) = sync_sums(sync, [torch.stack(rows(local_params, local_grads)).sum(0)])
    out["global"] = torch.allclose(got, torch.stack(full).sum(0), rtol=1e-12)
    return out


def _full_params(model) -> dict[str, torch.Tensor]:
    return {
        n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        for n, p in model.named_parameters()
    }


# --------------------------------------------------------------------------- layouts


def _tp_kind(name: str) -> str:
    return "nobias" if "-nobias-" in name else "mlp"


def _tp_model(kind: str) -> nn.Module:
    """The MLP that the tensor-parallel runs shard by hand (``nobias``: no replicated tensor)."""
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2, bias=kind == "mlp")).double()


def _shard_tp(model: nn.Module, kind: str, mesh) -> tuple[nn.Module, object]:
    """Megatron layout: column-wise W1, b1 = Shard(0); row-wise W2 = Shard(1), b2 replicated."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    layout = {"0.weight": Shard(0), "0.bias": Shard(0), "2.weight": Shard(1)}
    if kind == "mlp":
        layout["2.bias"] = Replicate()
    for name, placement in layout.items():
        module_name, attr = name.split(".")
        module = model.get_submodule(module_name)
        full = getattr(module, attr).detach()
        setattr(module, attr, nn.Parameter(distribute_tensor(full, mesh, [placement])))

    def forward(X):
        return model(distribute_tensor(X, mesh, [Replicate()]))

    return model, forward


def _run_tp(name: str, opt: str, kw: dict, mesh) -> dict:
    kind = _tp_kind(name)
    model, forward = _shard_tp(_tp_model(kind), kind, mesh)
    optimizer = OPTIMIZERS[opt](model.parameters(), **kw)
    # tensor parallel: every rank sees the whole batch
    betas = _train(model, optimizer, slice(0, BATCH), forward, outputs=2)
    stats = comm_stats()
    return {
        "betas": betas,
        "params": _full_params(model),
        "stats": stats,
        "sums": _combined_sums(model),
    }


def _fsdp(model: nn.Module, mesh) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _run_fsdp(name: str, opt: str, kw: dict, mesh, rank: int) -> dict:
    dtype = torch.float32 if name.endswith("float32") else torch.float64
    model = _fsdp(_mlp(dtype, mixed=name.endswith("mixed")), mesh)
    optimizer = OPTIMIZERS[opt](model.parameters(), **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        betas = _train(model, optimizer, _rows(rank), dtype=dtype)
    return {
        "betas": betas,
        "params": _full_params(model),
        "warnings": [str(w.message) for w in caught],
        "stats": comm_stats(),  # before the checks of the sums below add their own
        "sums": _combined_sums(model),
    }


def _run_zero(name: str, opt: str, kw: dict, rank: int) -> dict:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = _mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    params = list(model.parameters())
    if name.endswith("two-groups"):  # one tensor in the first group: one rank's part is empty
        params = [{"params": params[:1]}, {"params": params[1:]}]
    cls, hyper = HYPER[opt]
    optimizer = ZeroRedundancyOptimizer(params, optimizer_class=cls, **{**hyper, **kw})
    betas = _train(model, optimizer, _rows(rank), ddp)
    stats = comm_stats()
    optimizer.consolidate_state_dict(to=0)  # the local state dicts travel pickled
    if rank == 0:
        torch.save(optimizer.state_dict(), io.BytesIO())
    return {"betas": betas, "params": _full_params(model), "stats": stats}


def _run_partition(name: str, opt: str, kw: dict, rank: int) -> dict:
    """Each rank steps half the tensors, as a hand-written ZeRO would; DDP gives the gradients."""
    model = _mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    mine = [p for k, p in enumerate(model.parameters()) if k % WORLD_SIZE == rank]
    optimizer = OPTIMIZERS[opt](mine, process_group=dist.group.WORLD, **kw)

    @torch.no_grad()
    def gather():  # every rank gets the partitions of the others
        for k, p in enumerate(model.parameters()):
            dist.broadcast(p, src=k % WORLD_SIZE)

    betas = _train(model, optimizer, _rows(rank), ddp, after_step=gather)
    return {"betas": betas, "params": _full_params(model)}


def _run_ddp(name: str, opt: str, kw: dict, rank: int) -> dict:
    model = _mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = OPTIMIZERS[opt](ddp.parameters(), **kw)
    betas = _train(model, optimizer, _rows(rank), ddp)
    return {"betas": betas, "params": _full_params(model)}


def _errors(mesh, rank: int) -> dict[str, str]:
    """The message of every rejected layout (each raises on both ranks, before any collective)."""
    from torch.distributed.tensor import DTensor, Partial

    out = {}

    def expect(key, fn):
        try:
            fn()
        except (RuntimeError, TypeError, ValueError) as exc:
            out[key] = f"{type(exc).__name__}: {exc}"
        else:
            out[key] = "no error"

    def partial():
        w = nn.Parameter(DTensor.from_local(torch.ones(3, dtype=torch.float64), mesh, [Partial()]))
        w.grad = DTensor.from_local(torch.ones(3, dtype=torch.float64), mesh, [Partial()])
        AMAdamW([w]).step()

    def mixed_scope():
        model, _ = _shard_tp(_tp_model("mlp"), "mlp", mesh)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        AMSGD(model.parameters(), lr=0.1, per_layer=False).step()

    def plain_in_global_dtensor_scope():
        model, _ = _shard_tp(_tp_model("nobias"), "nobias", mesh)
        extra = nn.Parameter(torch.ones(2, dtype=torch.float64))
        params = [*model.parameters(), extra]
        for p in params:
            p.grad = torch.zeros_like(p)
        AMAdamW(params, lr=0.1, per_layer=False).step()

    def partition_without_group():
        model = _mlp()
        ddp = nn.parallel.DistributedDataParallel(model)
        mine = [p for k, p in enumerate(model.parameters()) if k % WORLD_SIZE == rank]
        _train(model, AMSGD(mine, lr=0.1), _rows(rank), ddp)

    def fsdp1_flat_parameter():
        w = nn.Parameter(torch.ones(4, dtype=torch.float64))
        w._fsdp_flattened = True  # what FullyShardedDataParallel marks its flat parameters with
        w.grad = torch.ones_like(w)
        AMAdamW([w]).step()

    expect("partial", partial)
    expect("fsdp1", fsdp1_flat_parameter)
    expect("mixed-scope", mixed_scope)
    expect("plain-in-global-dtensor-scope", plain_in_global_dtensor_scope)
    expect("partition-without-group", partition_without_group)
    return out


def _misc(mesh) -> dict:
    """A process group in a param group; the fused kernels on replicated DTensors.

    ``state_dict()`` must pickle and ``load_state_dict`` keep the running group; the
    fused kernels run on the local tensors of ``Replicate()`` DTensors.
    """
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    out = {}
    w = nn.Parameter(torch.ones(3, dtype=torch.float64))
    w.grad = torch.ones_like(w)
    opt = AMSGD([w], lr=0.1, process_group=dist.group.WORLD)
    opt.step()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    opt.load_state_dict(torch.load(buffer))
    out["group_kept"] = opt.param_groups[0]["process_group"] is dist.group.WORLD

    torch.manual_seed(3)
    full = torch.randn(5, 4, dtype=torch.float64)
    grads = [torch.randn(5, 4, dtype=torch.float64) for _ in range(3)]
    replicated = nn.Parameter(distribute_tensor(full, mesh, [Replicate()]))
    plain = nn.Parameter(full.clone())
    fused = AMAdamW([replicated], lr=0.1, fused=True)
    reference = AMAdamW([plain], lr=0.1, fused=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for g in grads:
            replicated.grad = distribute_tensor(g, mesh, [Replicate()])
            plain.grad = g.clone()
            fused.step()
            reference.step()
    out["fused_warnings"] = [str(w.message) for w in caught]
    out["fused_equal"] = torch.equal(replicated.to_local(), plain.detach())

    # a plain tensor among DTensors (a parameter FSDP2 ignores): a per-layer scope of its own
    sharded = nn.Parameter(distribute_tensor(full, mesh, [Shard(0)]))
    whole = nn.Parameter(full[0].clone())
    params = [nn.Parameter(full.clone()), nn.Parameter(full[0].clone())]
    mixed = AMSGD([sharded, whole], lr=0.1, per_layer=True)
    reference = AMSGD(params, lr=0.1, per_layer=True)
    for g in grads:
        sharded.grad = distribute_tensor(g, mesh, [Shard(0)])
        whole.grad = g[1].clone()
        params[0].grad, params[1].grad = g.clone(), g[1].clone()
        mixed.step()
        reference.step()
    out["mixed_equal"] = torch.allclose(
        sharded.full_tensor(), params[0].detach(), rtol=1e-12
    ) and torch.equal(whole.detach(), params[1].detach())
    return out


def _checkpoint(mesh, rank: int, directory: str) -> dict:
    """Save after 3 steps (torch.distributed.checkpoint), resume in a new model: bit-identical."""
    import copy

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        get_state_dict,
        set_optimizer_state_dict,
        set_state_dict,
    )

    out = {}
    cases = (("AMAdamW", {"per_layer": False}), ("AMSGD", {"per_layer": True}), ("full", {}))
    for opt, kw in cases:
        path = os.path.join(directory, f"ckpt-{opt}")

        def build(opt=opt, kw=kw):
            model = _fsdp(_mlp(), mesh)
            return model, OPTIMIZERS["AMAdamW" if opt == "full" else opt](model.parameters(), **kw)

        def steps(model, optimizer, first):
            for t in range(first, first + 3):
                X, y = _batch(t)
                optimizer.zero_grad()
                nn.functional.mse_loss(model(X[_rows(rank)]), y[_rows(rank)]).backward()
                optimizer.step()

        model, optimizer = build()
        steps(model, optimizer, 0)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        if opt == "full":  # the optimizer's state as full tensors on every rank
            full = StateDictOptions(full_state_dict=True)
            # a copy: the 0-d step counters would otherwise stay those of the live state
            optim_full = copy.deepcopy(get_optimizer_state_dict(model, optimizer, options=full))
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
        steps(model, optimizer, 3)
        straight = {n: p.to_local().clone() for n, p in model.named_parameters()}
        straight_state = get_optimizer_state_dict(model, optimizer)

        model, optimizer = build()
        model_sd, optim_sd = get_state_dict(model, optimizer)  # initialises the state
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        if opt == "full":
            model, optimizer = build()
            model.load_state_dict(state["model"])
            set_optimizer_state_dict(model, optimizer, optim_full, options=full)
        steps(model, optimizer, 3)
        resumed = {n: p.to_local().clone() for n, p in model.named_parameters()}
        resumed_state = get_optimizer_state_dict(model, optimizer)

        def local(v):
            return v.to_local() if hasattr(v, "to_local") else v

        out[opt] = {
            "params_equal": all(torch.equal(straight[n], resumed[n]) for n in straight),
            "state_equal": all(
                torch.equal(local(v), local(resumed_state["state"][fqn][k]))
                for fqn, entry in straight_state["state"].items()
                for k, v in entry.items()
            ),
            "state_keys": sorted({k for e in straight_state["state"].values() for k in e}),
            "momentum_is_dtensor": [
                hasattr(s["momentum_buffer"], "to_local")
                for s in optimizer.state.values()
                if "momentum_buffer" in s
            ],
        }
    return out


# --------------------------------------------------------------------------- the job


def _worker(rank: int, port: int, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    init_rank(rank, port, WORLD_SIZE)
    results: dict = {}
    try:
        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        for name, (opt, kw) in TWO_RANKS.items():
            comm_stats(reset=True)
            started = time.perf_counter()
            try:
                if name in FSDP:
                    res = _run_fsdp(name, opt, kw, mesh, rank)
                elif name in ZERO:
                    res = _run_zero(name, opt, kw, rank)
                elif name in TP:
                    res = _run_tp(name, opt, kw, mesh)
                elif name.startswith("partition"):
                    res = _run_partition(name, opt, kw, rank)
                else:
                    res = _run_ddp(name, opt, kw, rank)
            except Exception:  # reported by the test of this configuration
                res = {"error": traceback.format_exc()}
            res.setdefault("stats", comm_stats())
            res["seconds"] = time.perf_counter() - started
            results[name] = res
        results["errors"] = _errors(mesh, rank)
        results["misc"] = _misc(mesh)
        results["checkpoint"] = _checkpoint(mesh, rank, out_dir)
        dist.barrier()  # no rank tears gloo down while another still talks to it
    finally:
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()
    exit_without_teardown()


def _run_2d(name: str, opt: str, kw: dict, mesh) -> dict:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if name.startswith("hsdp"):
        model = _fsdp(_mlp(), mesh)
        rows = slice(dist.get_rank() * BATCH // 4, (dist.get_rank() + 1) * BATCH // 4)
        outputs = 1
    else:
        model = _tp_model("mlp")
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        model = _fsdp(model, mesh["dp"])
        rows, outputs = _rows(mesh["dp"].get_local_rank()), 2
    optimizer = OPTIMIZERS[opt](model.parameters(), **kw)
    betas = _train(model, optimizer, rows, outputs=outputs)
    placements = {n: repr(tuple(p.placements)) for n, p in model.named_parameters()}
    return {
        "betas": betas,
        "params": _full_params(model),
        "placements": placements,
        "stats": comm_stats(),  # before the checks of the sums below add their own
        "sums": _combined_sums(model),
    }


def _worker_2d(rank: int, port: int, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    started = time.perf_counter()
    init_rank(rank, port, 4)
    results: dict = {}
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        for name, (opt, kw) in MESH_2D.items():
            comm_stats(reset=True)
            try:
                res = _run_2d(name, opt, kw, mesh)
            except Exception:
                res = {"error": traceback.format_exc()}
            res.setdefault("stats", comm_stats())
            results[name] = res
        results["seconds"] = time.perf_counter() - started
        dist.barrier()
    finally:
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()
    exit_without_teardown()


@pytest.fixture(scope="module")
def ranks():
    two = spawn(_worker, WORLD_SIZE, TIMEOUT_S)
    four = spawn(_worker_2d, 4, TIMEOUT_S)
    return [{**r, **four[k]} for k, r in enumerate(two)] + four[WORLD_SIZE:]


# --------------------------------------------------------------------------- references


def _reference(name: str) -> dict:
    """The same training in one process, on the whole batch, with plain tensors."""
    opt, kw = CONFIGS[name]
    kw = {k: v for k, v in kw.items() if k != "fused"}
    if name.startswith(("tp-", "fsdp-x-tp")):
        model, outputs, dtype = _tp_model(_tp_kind(name)), 2, torch.float64
    else:
        dtype = torch.float32 if name.endswith("float32") else torch.float64
        model, outputs = _mlp(dtype, mixed=name.endswith("mixed")), 1
    params = list(model.parameters())
    if name.endswith("two-groups"):
        params = [{"params": params[:1]}, {"params": params[1:]}]
    optimizer = OPTIMIZERS[opt](params, **kw)
    betas = _train(model, optimizer, slice(0, BATCH), dtype=dtype, outputs=outputs)
    return {"betas": betas, "params": _full_params(model)}


def _tolerance(name: str) -> dict:
    # float64: the ranks add their halves of the batch and of each scope in another order
    # than the reference (a few ulps), amplified by a few steps of the rule
    if name.endswith(("float32", "mixed")):
        return {"rtol": 1e-6, "atol": 1e-7}
    return {"rtol": 1e-10, "atol": 1e-12}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_single_process(ranks, name):
    ranks = [r for r in ranks if name in r]  # the 2-D mesh runs have four ranks
    for rank, result in enumerate(ranks):
        assert "error" not in result[name], f"rank {rank}:\n{result[name]['error']}"
    ref = _reference(name)
    tol = _tolerance(name)
    for rank, result in enumerate(ranks):
        got = result[name]
        for n, p in ref["params"].items():
            torch.testing.assert_close(got["params"][n], p, **tol, msg=f"{name} {n} rank {rank}")
        assert len(got["betas"]) == N_STEPS
        for t, (step, ref_step) in enumerate(zip(got["betas"], ref["betas"], strict=True)):
            assert step, f"{name}: rank {rank} stepped no parameter"
            for n, beta in step.items():
                assert beta == pytest.approx(ref_step[n], rel=tol["rtol"], abs=tol["atol"]), (
                    f"{name}: beta of {n} at step {t} on rank {rank}"
                )
    # ZeRO ranks hold different parameters; together they hold all of them
    seen = set().union(*(result[name]["betas"][-1] for result in ranks))
    assert seen == set(ref["params"])
    interior = [b for step in ref["betas"] for b in step.values() if 0.0 < b < 0.9 * (1 - 1e-6)]
    assert interior, f"{name}: beta never left its bounds, the test would be weak"


def _packed(name: str) -> tuple[int, int]:
    """(collectives per step, scopes in each): one per param group with a sharded scope."""
    if name in ZERO and CONFIGS[name][1]["per_layer"]:
        return 0, 0  # each rank holds whole tensors
    if name.endswith("two-groups"):
        return 2, 1
    if not CONFIGS[name][1]["per_layer"]:
        return 1, 1
    if name.startswith("fsdp-x-tp"):
        return 1, 4  # one all-reduce over the whole mesh; the bias replicated on "tp" masked
    # every FSDP2 tensor (the empty shard too); the replicated TP bias needs no reduction
    return 1, 3 if name.startswith("tp-") else 6


@pytest.mark.parametrize("name", [n for n in CONFIGS if not n.startswith(("ddp", "partition"))])
def test_one_packed_all_reduce_per_step(ranks, name):
    collectives, scopes = _packed(name)
    for result in (r for r in ranks if name in r):
        stats = result[name]["stats"]
        assert stats["collectives"] == collectives * N_STEPS, stats
        # 3 sums per scope, float64
        assert stats["bytes"] == collectives * N_STEPS * scopes * 3 * 8, stats


@pytest.mark.parametrize("name", [n for n in CONFIGS if n.startswith(("fsdp", "tp", "hsdp"))])
def test_combined_sums_are_those_of_the_full_tensors(ranks, name):
    expected = {"per-layer", "buckets"}
    if not CONFIGS[name][1]["per_layer"] or "nobias" in name or name.startswith(("fsdp2", "hsdp")):
        expected.add("global")
    for result in (r for r in ranks if name in r):
        sums = result[name]["sums"]
        assert set(sums) == expected and all(sums.values()), sums


def test_2d_meshes_hold_the_layouts_they_test(ranks):
    placements = ranks[0]["fsdp-x-tp-AMAdamW-layer-foreach"]["placements"]
    assert "_StridedShard" in placements["0.weight"]  # FSDP over a TP-sharded dim
    assert "Replicate" in placements["2.bias"]  # sharded over "dp" only: masked on "tp"
    assert ranks[0]["hsdp-AMSGD-global-foreach"]["placements"]["0.weight"] == (
        "(Replicate(), Shard(dim=0))"
    )


def test_state_dict_pickles_and_keeps_the_process_group(ranks):
    assert ranks[0]["misc"]["group_kept"]


def test_fused_kernels_run_on_replicated_dtensors(ranks):
    if not fused_status()["available"]:
        pytest.skip("no fused kernels here")
    misc = ranks[0]["misc"]
    assert misc["fused_warnings"] == [] and misc["fused_equal"], misc


def test_plain_tensors_among_dtensors_are_per_layer_scopes(ranks):
    assert ranks[0]["misc"]["mixed_equal"]


def test_ddp_needs_no_collective(ranks):
    assert ranks[0]["ddp-AMSGD-global"]["stats"]["collectives"] == 0


def test_fused_kernels_run_on_sharded_scopes(ranks):
    """The fused path reduces on the local shards, adds the sums across ranks, then applies:
    no fallback (the run itself is compared with one process above)."""
    messages = ranks[0]["fsdp2-AMAdamW-layer-fused"]["warnings"]
    if not fused_status()["available"]:
        pytest.skip("no fused kernels here")
    assert not any("fused" in m.lower() for m in messages), messages


@pytest.mark.parametrize(
    "key, pieces",
    [
        ("partial", ["ValueError", "Partial", "mesh dim 0", "parameter 0", "(3,)"]),
        (
            "mixed-scope",
            ["ValueError", "per_layer=False", "parameter 0", "parameter 3", "Replicate"],
        ),
        (
            "plain-in-global-dtensor-scope",
            ["ValueError", "per_layer=False", "parameter 3", "torch.Tensor", "Shard(dim=0)"],
        ),
        ("partition-without-group", ["RuntimeError", "per_layer=False", "process_group="]),
        ("fsdp1", ["ValueError", "parameter 0", "FSDP1", "fully_shard"]),
    ],
)
def test_rejected_layouts_name_the_parameter(ranks, key, pieces):
    for result in ranks[:WORLD_SIZE]:
        message = result["errors"][key]
        for piece in pieces:
            assert piece in message, message


@pytest.mark.parametrize("opt", ["AMAdamW", "AMSGD", "full"])
def test_distributed_checkpoint_resumes_bit_identically(ranks, opt):
    for result in ranks[:WORLD_SIZE]:
        ckpt = result["checkpoint"][opt]
        assert ckpt["params_equal"] and ckpt["state_equal"], ckpt
        assert "beta" in ckpt["state_keys"] and "step" in ckpt["state_keys"]
        if opt == "AMSGD":  # buffers created on local tensors are stored as DTensors
            assert ckpt["momentum_is_dtensor"] and all(ckpt["momentum_is_dtensor"])
