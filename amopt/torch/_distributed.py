r"""Beta under sharding: the sums of a sharded scope, combined across the ranks that hold it.

The AM beta of a scope (one parameter tensor, or every parameter of a param group)
is a function of a few sums over *all* coordinates of the scope
(:data:`amopt.core.rule.MOMENTUM_SUMS`, :data:`amopt.core.rule.ADAM_SUMS`). The sums are
additive, so a rank holding a piece of a scope computes the sums of its piece
(the reduce kernels run unchanged on plain local tensors) and the pieces are
added across the ranks before the rule, at the seam between reduce and rule:

- ``DTensor`` parameters (FSDP2 ``fully_shard``, tensor parallel, HSDP): the
  placements and the device mesh say which ranks hold the pieces. A mesh dim with
  ``Shard(d)`` or ``_StridedShard`` contributes its process group (the order in
  which a rank holds its rows does not change a sum); ``Replicate()`` dims
  contribute nothing; ``Partial`` parameters are rejected. The kernels see
  ``to_local()`` tensors.
- plain tensors that each rank holds a partition of (``ZeroRedundancyOptimizer``):
  the ``per_layer=False`` scope is combined over ``process_group``. Per-layer
  scopes of plain tensors are whole tensors on every rank and need nothing.
- replicated parameters (``DistributedDataParallel``, ``Replicate()``) need no
  collective: every rank already holds the whole scope.

All scopes of one step whose pieces lie on the same ranks go into one flat
float64 buffer (float32 where the device has no float64): one ``all_reduce`` per
param group step, issued asynchronously; waiting on it enqueues a stream wait on
CUDA and never reads a value on the host. Every rank then holds bit-identical
sums, hence the same beta.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from amopt.torch._common import foreach_sqsum
from amopt.torch._records import Sharded, as_real

__all__ = [
    "ScopeSync",
    "attach",
    "comm_stats",
    "join_empty",
    "localize",
    "plan_locals",
    "scope_group",
    "store_new_states",
    "sync_sums",
]

#: Sums per scope of the optimizers' rules: ``vv, gg, dd`` (linearised AM-MSGD) and
#: ``num, den, ref`` (AM-Adam); a rank with nothing to reduce contributes this many zeros.
_K = 3

_STATS = {"collectives": 0, "bytes": 0, "seconds": 0.0}


def comm_stats(reset: bool = False) -> dict[str, float]:
    """Totals of the collectives issued to combine sharded sums, since the last reset.

    Parameters
    ----------
    reset : bool, default False
        Zero the counters after reading them.

    Returns
    -------
    dict
        ``collectives`` (number of ``all_reduce`` calls), ``bytes`` (payload of this
        rank) and ``seconds`` (host time from issuing them to the end of their
        waits; with CUDA tensors this is the time to enqueue them).
    """
    out = dict(_STATS)
    if reset:
        _STATS.update(collectives=0, bytes=0, seconds=0.0)
    return out


# --------------------------------------------------------------------------- placements


def _dtensor_type() -> type | None:
    # DTensors exist only once their module is imported: no import cost for anyone else
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def _is_sharded(placement: Any) -> bool:
    if placement.is_shard():
        return True
    strided = getattr(
        sys.modules.get("torch.distributed.tensor.placement_types"), "_StridedShard", None
    )
    return strided is not None and isinstance(placement, strided)


def _describe(i: int, t: Tensor) -> str:
    placements = getattr(t, "placements", None)
    if placements is None:
        return f"parameter {i} of the param group (a torch.Tensor of shape {tuple(t.shape)})"
    return (
        f"parameter {i} of the param group (a DTensor of shape {tuple(t.shape)}, "
        f"placements {tuple(placements)}, mesh {t.device_mesh})"
    )


class _MeshKey:
    """The ranks that hold pieces of a DTensor: its mesh and the dims it is sharded over."""

    __slots__ = ("coordinate", "mesh", "shard_dims")

    def __init__(self, i: int, p: Tensor) -> None:
        mesh = p.device_mesh
        coordinate = mesh.get_coordinate()
        if coordinate is None:
            raise ValueError(f"{_describe(i, p)}: this rank is not in the device mesh")
        shard = []
        for dim, placement in enumerate(p.placements):
            if _is_sharded(placement):
                if mesh.size(dim) > 1:
                    shard.append(dim)
            elif not placement.is_replicate():
                raise ValueError(
                    f"{_describe(i, p)}: the placement {placement!r} on mesh dim {dim} is "
                    "not supported; the AM optimizers need parameters that are sharded "
                    "(Shard, _StridedShard) or replicated (Replicate) on every mesh dim"
                )
        self.mesh, self.shard_dims, self.coordinate = mesh, tuple(shard), tuple(coordinate)

    def same_ranks(self, other: Any) -> bool:
        if other is None or not isinstance(other, _MeshKey):
            return not self.shard_dims  # replicated everywhere, as a plain tensor
        return self.shard_dims == other.shard_dims and (
            not self.shard_dims or self.mesh == other.mesh
        )


class _Channel:
    """Rows combined by one collective (or one per mesh dim, in sequence)."""

    __slots__ = ("groups", "mesh", "dims")

    def __init__(self, groups: tuple[Any, ...], mesh: Any = None, dims: tuple[int, ...] = ()):
        self.groups, self.mesh, self.dims = groups, mesh, dims


def _mesh_channel(mesh: Any, dims: tuple[int, ...]) -> _Channel:
    import torch.distributed as dist

    active = [d for d in range(mesh.ndim) if mesh.size(d) > 1]
    if set(dims) == set(active) and mesh.size() == dist.get_world_size():
        groups: tuple[Any, ...] = (dist.group.WORLD,)
    else:
        # a sub-mesh sharded over several dims: one collective per dim, in sequence
        groups = tuple(mesh.get_group(d) for d in dims)
    return _Channel(groups, mesh, dims)


def _group_size(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group)


# --------------------------------------------------------------------------- the plan


class ScopeSync:
    """How the sums of each beta scope of one step are combined across ranks.

    Built by :func:`localize`; :func:`sync_sums` applies it at the seam between
    reduce and rule. Each scope (each parameter with ``per_layer=True``, the whole
    group otherwise) is either local or assigned to a channel: a set of ranks that
    hold pieces of it, reduced with one packed ``all_reduce``. A scope replicated
    on some dims of a channel's ranks contributes from one replica only (its rows
    are zeros elsewhere), so that mixing placements on one mesh stays exact.
    """

    __slots__ = ("channels", "masked", "per_layer", "row_channel")

    def __init__(self, per_layer: bool, keys: Sequence[Any]) -> None:
        self.per_layer = per_layer
        self.channels: list[_Channel] = []
        self.row_channel: list[int] = []
        self.masked: list[bool] = []
        meshes: list[tuple[Any, set[int]]] = []
        for key in keys:
            if isinstance(key, _MeshKey) and key.shard_dims:
                for mesh, dims in meshes:
                    if mesh == key.mesh:
                        dims.update(key.shard_dims)
                        break
                else:
                    meshes.append((key.mesh, set(key.shard_dims)))
        for mesh, dims in meshes:
            self.channels.append(_mesh_channel(mesh, tuple(sorted(dims))))
        groups: list[Any] = []
        for key in keys:
            if isinstance(key, _MeshKey) and key.shard_dims:
                c = next(k for k, ch in enumerate(self.channels) if ch.mesh == key.mesh)
                replicated = set(self.channels[c].dims) - set(key.shard_dims)
                self.row_channel.append(c)
                self.masked.append(any(key.coordinate[d] != 0 for d in replicated))
            elif key is not None and not isinstance(key, _MeshKey):  # a process group
                for k, group in enumerate(groups):
                    if group is key:
                        c = k
                        break
                else:
                    groups.append(key)
                    self.channels.append(_Channel((key,)))
                    c = len(self.channels) - 1
                self.row_channel.append(c)
                self.masked.append(False)
            else:
                self.row_channel.append(-1)
                self.masked.append(False)
        for channel in self.channels:
            channel.groups = tuple(g for g in channel.groups if _group_size(g) > 1)

    @property
    def needs_collective(self) -> bool:
        """Whether any scope of the step has pieces on other ranks."""
        return any(ch.groups for ch in self.channels)

    def combine(
        self, sums: Sequence[Tensor], index: Sequence[Sequence[int]] | None
    ) -> list[Tensor]:
        """The sums of every scope, added over the ranks of its channel; see :func:`sync_sums`."""
        out = list(sums)
        if not self.needs_collective:
            return out
        # rows are picked with unbind/stack, never with an index tensor: building one on
        # the device would copy from the host and synchronise with the stream
        entries = []  # (entry, its rows, the scope of each row)
        for j, s in enumerate(sums):
            rows = s.unbind(0) if s.dim() == 2 else (s,)
            if not self.per_layer:
                scopes: Sequence[int] = [0] * len(rows)
            elif index is None:
                scopes = [j] if s.dim() == 1 else range(len(rows))
            else:
                scopes = index[j]
            entries.append((j, rows, scopes))
        device = sums[0].device
        dtype = torch.float32 if device.type == "mps" else torch.float64
        works = []
        started = time.perf_counter()
        for c, channel in enumerate(self.channels):
            if not channel.groups:
                continue
            parts, layout = [], []
            for j, rows, scopes in entries:
                picked = [r for r, scope in enumerate(scopes) if self.row_channel[scope] == c]
                for r in picked:
                    row = rows[r].to(device=device, dtype=dtype)
                    parts.append(torch.zeros_like(row) if self.masked[scopes[r]] else row)
                if picked:
                    layout.append((j, picked))
            if not parts:
                continue
            buf = torch.cat(parts)  # a new tensor: the all-reduce never writes into ``sums``
            works.append((buf, layout, parts[0].numel(), self._all_reduce(buf, channel.groups)))
        for buf, layout, k, work in works:
            work.wait()
            reduced = buf.view(-1, k).unbind(0)
            offset = 0
            for j, picked in layout:
                s = out[j]
                if s.dim() == 1:
                    out[j] = reduced[offset].to(device=s.device, dtype=s.dtype)
                else:
                    rows = list(s.unbind(0))
                    for n, r in enumerate(picked):
                        rows[r] = reduced[offset + n].to(device=s.device, dtype=s.dtype)
                    out[j] = torch.stack(rows)
                offset += len(picked)
        _STATS["seconds"] += time.perf_counter() - started
        return out

    @staticmethod
    def _all_reduce(buf: Tensor, groups: tuple[Any, ...]) -> Any:
        import torch.distributed as dist

        _STATS["collectives"] += len(groups)
        _STATS["bytes"] += len(groups) * buf.numel() * buf.element_size()
        for group in groups[:-1]:  # several mesh dims: each sum feeds the next
            dist.all_reduce(buf, group=group)
        return dist.all_reduce(buf, group=groups[-1], async_op=True)


def sync_sums(
    sync: ScopeSync | None,
    sums: Sequence[Tensor],
    index: Sequence[Sequence[int]] | None = None,
) -> list[Tensor]:
    """The seam between reduce and rule: per-scope sums added across the ranks of each scope.

    Parameters
    ----------
    sync : ScopeSync or None
        The plan of the step (from :func:`localize`); ``None``: nothing to combine.
    sums : sequence of Tensor
        Sums of shape ``(k,)`` or ``(m, k)``, ``k`` the sums of one scope.
    index : sequence of sequences of int, optional
        With ``per_layer=True``, the parameter index of each row of ``sums[j]``;
        ``None``: row ``j`` of a ``(k,)`` entry is parameter ``j`` (one entry per
        scope). With ``per_layer=False`` there is one row, the group's scope.

    Returns
    -------
    list of Tensor
        The sums, same shapes and dtypes, identical on every rank of a scope.
    """
    if sync is None:
        return list(sums)
    return sync.combine(sums, index)


# --------------------------------------------------------------------------- local tensors


def _local(i: int, t: Tensor | None, p: Tensor, what: str, dtensor: type) -> Tensor | None:
    if t is None:
        return None
    if not isinstance(p, dtensor):
        if isinstance(t, dtensor):
            raise TypeError(f"{_describe(i, p)}: its {what} is a DTensor")
        return t
    if not isinstance(t, dtensor):
        raise TypeError(
            f"{_describe(i, p)} is a DTensor but its {what} is a {type(t).__name__}; "
            "load optimizer state of sharded models with "
            "torch.distributed.checkpoint.state_dict.set_optimizer_state_dict"
        )
    if t.device_mesh != p.device_mesh:
        raise ValueError(f"{_describe(i, p)}: its {what} lives on another mesh ({t.device_mesh})")
    if tuple(t.placements) != tuple(p.placements):
        if what != "gradient":
            raise ValueError(
                f"{_describe(i, p)}: its {what} has the placements {tuple(t.placements)}"
            )
        # e.g. a tensor-parallel weight sharded on dim 1 receives a replicated gradient
        t = t.redistribute(p.device_mesh, p.placements)
    return t.to_local()


def _group_key(process_group: Any) -> Any:
    if process_group is None or _group_size(process_group) == 1:
        return None
    return process_group


def _reject_flat(params: list[Tensor]) -> None:
    """FSDP1 gives each rank flat pieces of its tensors, with nothing saying how they join."""
    for i, p in enumerate(params):
        if getattr(p, "_fsdp_flattened", False):
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                raise ValueError(
                    f"{_describe(i, p)} is flattened by FullyShardedDataParallel (FSDP1): each "
                    "rank holds a flat piece of it, so no rank can compute the beta of its "
                    "scope. Shard the model with torch.distributed.fsdp.fully_shard (FSDP2), "
                    "whose DTensor parameters the AM optimizers combine across ranks"
                )
            return


def _same_as_plain(key: Any) -> bool:
    return key is None or not key.shard_dims


def localize(
    params: list[Tensor],
    grads: list[Tensor],
    *states: list[Tensor | None],
    per_layer: bool,
    process_group: Any = None,
) -> tuple[Any, ...]:
    """Local tensors and the plan of one step: ``(params, grads, *states, sync)``.

    Parameters
    ----------
    params, grads : list of Tensor
        The param group's tensors: plain tensors or DTensors.
    *states : list of Tensor or None
        Per-parameter state lists (momentum buffers, moments) laid out like their
        parameters; ``None`` entries are kept.
    per_layer : bool
        The beta scope.
    process_group : ProcessGroup, optional
        The ranks that together hold the ``per_layer=False`` scope of plain tensors.

    Returns
    -------
    tuple
        The lists with every DTensor replaced by its local tensor (the same list
        objects when there is none) and the :class:`ScopeSync` of the step, or
        ``None`` when no scope has pieces on other ranks.

    Raises
    ------
    ValueError
        A placement other than ``Shard``/``_StridedShard``/``Replicate``, state laid
        out unlike its parameter, or a ``per_layer=False`` scope whose parameters are
        spread over different ranks (naming the two parameters).
    TypeError
        A DTensor parameter with a plain-tensor gradient or state, or the reverse.

    Notes
    -----
    Plain tensors in a group of DTensors are taken to be whole on every rank (as
    the parameters FSDP2 is told to ignore): per-layer scopes of their own, and
    part of a ``per_layer=False`` scope only with DTensors that are replicated too.
    """
    dtensor = _dtensor_type()
    if dtensor is None or not any(isinstance(p, dtensor) for p in params):
        if dtensor is not None:
            for i, g in enumerate(grads):
                if isinstance(g, dtensor):
                    raise TypeError(
                        f"{_describe(i, params[i])} is a torch.Tensor, its gradient a DTensor"
                    )
        _reject_flat(params)
        key = None if per_layer else _group_key(process_group)
        sync = None if key is None else ScopeSync(False, [key])
        return (params, grads, *states, sync)

    # plain tensors among DTensors: whole on every rank (e.g. parameters FSDP2 ignores)
    keys = [_MeshKey(i, p) if isinstance(p, dtensor) else None for i, p in enumerate(params)]
    local_params = [p.to_local() if isinstance(p, dtensor) else p for p in params]
    local_grads = [
        _local(i, g, p, "gradient", dtensor)
        for i, (g, p) in enumerate(zip(grads, params, strict=True))
    ]
    local_states = [
        [
            _local(i, s, p, "state", dtensor)
            for i, (s, p) in enumerate(zip(lst, params, strict=True))
        ]
        for lst in states
    ]
    if not per_layer:
        for i, key in enumerate(keys[1:], start=1):
            first = keys[0]
            if not (key.same_ranks(first) if key is not None else _same_as_plain(first)):
                raise ValueError(
                    f"per_layer=False: {_describe(0, params[0])} and {_describe(i, params[i])} "
                    "are spread over different ranks, so their sums cannot form one scope; "
                    "use per_layer=True or put them in separate param groups"
                )
        keys = keys[:1]
    sync = ScopeSync(per_layer, keys)
    if not sync.needs_collective:
        sync = None
    return (local_params, local_grads, *local_states, sync)


def plan_locals(
    params: list[Tensor],
    grads: list[Tensor],
    buffers: list[list[Tensor]],
    *,
    per_layer: bool,
    process_group: Any = None,
) -> Sharded | None:
    """What a planned step of a sharded group needs (:class:`~amopt.torch._records.Sharded`).

    ``None`` for a group with neither DTensors nor a scope combined over ranks (it is
    planned on its own tensors). Otherwise the local tensors of this step
    (:func:`localize`), its :class:`ScopeSync`, and the two functions a later step
    finds its local tensors with (the checks of :func:`localize`, run on the gradients
    only when they are new tensors).
    """
    local_params, local_grads, *local_buffers, sync = localize(
        params, grads, *buffers, per_layer=per_layer, process_group=process_group
    )
    if local_params is params and sync is None:
        return None
    dtensor = _dtensor_type()

    def local_grads_of(ps: list[Tensor], gs: list[Tensor]) -> list[Tensor]:
        pairs = enumerate(zip(gs, ps, strict=True))
        return [_local(i, g, p, "gradient", dtensor) for i, (g, p) in pairs]

    def local_param_of(p: Tensor) -> Tensor:
        # ``to_local()`` without autograd is the DTensor's own local tensor (of a
        # Parameter, a new view of it at each call); its address is what is checked
        return p._local_tensor if dtensor is not None and isinstance(p, dtensor) else p

    return Sharded(local_params, local_grads, local_buffers, sync, local_grads_of, local_param_of)


def store_new_states(
    dst: list[Tensor | None], src: list[Tensor | None], params: list[Tensor]
) -> None:
    """Put state tensors created on local tensors back into ``dst``, as DTensors like ``params``.

    A no-op when :func:`localize` returned ``dst`` itself (no DTensor).
    """
    if src is dst:
        return
    dtensor = _dtensor_type()
    for i, (old, new) in enumerate(zip(dst, src, strict=True)):
        if old is None and new is not None:
            p = params[i]
            if not isinstance(p, dtensor):
                dst[i] = new
                continue
            dst[i] = dtensor.from_local(
                new, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
            )


# --------------------------------------------------------------------------- optimizers


def _zero_group() -> Any:
    """The process group of the ``ZeroRedundancyOptimizer`` building the caller, if any."""
    module = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    zero = getattr(module, "ZeroRedundancyOptimizer", None)
    if zero is None:
        return None
    frame = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if isinstance(owner, zero):
            return owner.process_group
        frame = frame.f_back
    return None


def _strip_groups(optimizer: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
    # a ProcessGroup cannot be pickled; it belongs to the running job, not to a checkpoint
    for group in state_dict["param_groups"]:
        if "process_group" in group:
            group["process_group"] = None
    return state_dict


def _stash_groups(optimizer: Any, state_dict: dict[str, Any]) -> None:
    optimizer.__dict__["_am_groups_before_load"] = [
        g.get("process_group") for g in optimizer.param_groups
    ]


def _restore_groups(optimizer: Any) -> None:
    saved = optimizer.__dict__.pop("_am_groups_before_load", [])
    for group, pg in zip(optimizer.param_groups, saved, strict=False):
        group["process_group"] = pg


def attach(optimizer: Any) -> None:
    """Set up an AM optimizer for distributed use (called by its constructor).

    Finds the process group of an enclosing ``ZeroRedundancyOptimizer`` (which
    builds its local optimizer itself and keeps ``process_group`` to itself), and
    keeps process groups out of ``state_dict()`` (they cannot be pickled) while
    ``load_state_dict`` keeps those of the running optimizer.
    """
    optimizer.__dict__["_am_zero_group"] = _zero_group()
    optimizer.register_state_dict_post_hook(_strip_groups)
    optimizer.register_load_state_dict_pre_hook(_stash_groups)
    optimizer.register_load_state_dict_post_hook(_restore_groups)


def _default_device(group: Any) -> torch.device:
    import torch.distributed as dist

    if torch.cuda.is_available() and "nccl" in str(dist.get_backend(group)):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _replica_check_pending(optimizer: Any, group: dict[str, Any]) -> bool:
    import torch.distributed as dist

    if group["per_layer"] or group.get("process_group") is not None:
        return False
    if optimizer.__dict__.get("_am_zero_group") is not None:
        return False
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return False
    checked = optimizer.__dict__.get("_am_replicas_checked")  # (no setdefault: Dynamo)
    if checked is None:
        checked = optimizer._am_replicas_checked = set()
    if id(group) in checked:
        return False
    dtensor = _dtensor_type()
    if dtensor is not None and any(isinstance(p, dtensor) for p in group["params"]):
        checked.add(id(group))  # DTensor groups say themselves which ranks hold what
        return False
    return True


def _check_replicas(optimizer: Any, group: dict[str, Any], fingerprint: Tensor) -> None:
    """Raise unless every rank holds the same parameters (same gradients) in ``group``."""
    import torch.distributed as dist

    optimizer.__dict__["_am_replicas_checked"].add(id(group))
    gathered = [torch.empty_like(fingerprint) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, fingerprint)
    values = torch.stack(gathered).cpu()
    if bool((values == values[0]).all()):
        return
    index = next(k for k, g in enumerate(optimizer.param_groups) if g is group)
    name = type(optimizer).__name__
    raise RuntimeError(
        f"{name}: param group {index} has per_layer=False, but its parameters or their "
        f"gradients differ across the {dist.get_world_size()} ranks (each rank holds "
        f"{values[:, 1].to(torch.int64).tolist()} elements): each rank would compute its "
        "beta from its own partition of the scope. Pass process_group=<the group whose "
        "ranks together hold these parameters> (inside ZeroRedundancyOptimizer it is found "
        f"automatically), or per_layer=True; to keep one beta per rank on purpose, pass "
        "process_group=torch.distributed.new_subgroups(group_size=1)[0]"
    )


def scope_group(optimizer: Any, group: dict[str, Any], grads: list[Tensor]) -> Any:
    """The process group over which a param group's global scope is combined this step.

    The group's ``process_group``, else that of an enclosing
    ``ZeroRedundancyOptimizer``. Otherwise plain-tensor parameters of a
    ``per_layer=False`` group are taken to be replicas (DDP) once checked: on the
    first step, with ``torch.distributed`` initialised over several ranks, one
    ``all_gather`` of a fingerprint of the gradients over the default group checks
    that every rank holds the same scope, and raises ``RuntimeError`` if not.
    """
    if group.get("process_group") is not None:
        return group["process_group"]
    if group["per_layer"]:
        return None
    if optimizer.__dict__.get("_am_zero_group") is not None:
        return optimizer.__dict__["_am_zero_group"]
    if _replica_check_pending(optimizer, group):
        acc = torch.float32 if grads[0].device.type == "mps" else torch.float64
        total = torch.stack(foreach_sqsum([as_real(g) for g in grads], acc)).sum()
        numel = torch.tensor(float(sum(g.numel() for g in grads)), dtype=acc, device=total.device)
        _check_replicas(optimizer, group, torch.stack([total, numel]))
    return None


def join_empty(optimizer: Any, group: dict[str, Any]) -> None:
    """Take part in the collectives of a step in which this rank has no gradient in ``group``.

    A rank whose partition of a ``per_layer=False`` scope is empty (or has no
    gradients) still adds zeros to the scope's sums, so that the other ranks do
    not wait for it.
    """
    if group["per_layer"]:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    pg = group.get("process_group") or optimizer.__dict__.get("_am_zero_group")
    if pg is not None:
        if _group_size(pg) > 1:
            buf = torch.zeros(_K, dtype=torch.float64, device=_default_device(pg))
            work = ScopeSync._all_reduce(buf, (pg,))
            work.wait()
        return
    if _replica_check_pending(optimizer, group):
        fingerprint = torch.zeros(2, dtype=torch.float64, device=_default_device(None))
        _check_replicas(optimizer, group, fingerprint)
