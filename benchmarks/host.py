"""Host-side counts and timings that stand in on the CPU for GPU costs.

On a GPU every aten operation is a kernel launch and every value read back to
Python a synchronisation; the time the Python driver of the Triton kernels
spends before its launches is what the GPU waits for. These are counted or
timed here on CPU tensors:

* aten operations and host synchronisations, counted with
  :class:`benchmarks.counters.HostReads` (the counter the tests use too);
* :func:`triton_on_cpu`: the optimizers' default path routed to the Triton driver on
  CPU tensors (``TRITON_INTERPRET=1``) with every kernel launch replaced by a
  no-op that counts it, so that only the driver's host work runs;
* :class:`TritonHostCase`, :func:`foreach_step_ops` and :func:`minimize_counts`:
  the workloads of the stand-in rows (:mod:`benchmarks.standins`) and of the asv
  benchmarks.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from amopt.backends import library_available
from amopt.bench import cases

if TYPE_CHECKING:
    from benchmarks.counters import HostReads

__all__ = [
    "LaunchStub",
    "TritonHostCase",
    "device_strategy",
    "one_rank_mesh",
    "foreach_step_ops",
    "minimize_counts",
    "triton_on_cpu",
]

# --------------------------------------------------------------------------- Triton on CPU


class LaunchStub:
    """A kernel whose launches ``kernel[grid](*args, **kw)`` do nothing but count.

    ``launches`` is shared by every stub of one :func:`triton_on_cpu` block (name ->
    count).
    """

    def __init__(self, name: str, launches: Counter[str]) -> None:
        self.name, self.launches = name, launches

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return self._launch

    def _launch(self, *args: Any, **kwargs: Any) -> None:
        self.launches[self.name] += 1


def _force_triton(original: Callable) -> Callable:
    """``default_path`` that picks the Triton driver wherever a CUDA group would.

    With ``fused=True``, or neither flag given, a group of CPU tensors runs
    ``"triton"`` when ``amopt.torch._triton.available`` accepts its tensors (it does
    for CPU tensors under ``TRITON_INTERPRET=1``), as a group of CUDA tensors does.
    """
    from amopt.torch import _triton

    def default_path(params: Any, grads: Any, *, fused: Any, foreach: Any) -> tuple:
        path, reason = original(params, grads, fused=fused, foreach=foreach)
        wanted = fused is True or (fused is None and foreach is None)
        if wanted and path != "triton" and _triton.available([*params, *grads]) is None:
            return "triton", None
        return path, reason

    default_path.__wrapped__ = original  # type: ignore[attr-defined]
    return default_path


#: The modules of ``amopt.torch`` whose ``default_path`` :func:`triton_on_cpu` replaces.
_PATH_MODULES: list[Any] = []


@contextlib.contextmanager
def triton_on_cpu(stub: bool = True) -> Iterator[Counter[str]]:
    """Run the optimizers' Triton driver on CPU tensors, its launches stubbed.

    Inside the block ``TRITON_INTERPRET=1`` (Triton's interpreter accepts CPU
    tensors), every ``default_path`` of ``amopt.torch`` picks ``"triton"`` where a
    CUDA group would, and, with ``stub``, ``amopt.torch._triton._kernels`` returns
    :class:`LaunchStub` kernels: the driver builds its plan and launch arguments and
    launches nothing. Yields the launch counts (kernel name -> launches).

    Raises
    ------
    SkipCase
        Triton or ``amopt.torch._triton`` cannot be imported here.
    """
    # whether Triton imports is the registry's answer, probed once per process
    if not library_available("triton"):
        raise cases.SkipCase("triton is not installed (or does not import)")
    import importlib
    import sys

    import triton.runtime

    from amopt.torch import _triton

    launches: Counter[str] = Counter()
    original_kernels = _triton._kernels

    def kernels(interpret: bool) -> dict[str, Any]:
        real = original_kernels(interpret)
        out = {
            name: LaunchStub(name, launches)
            if isinstance(value, triton.runtime.KernelInterface)
            else value
            for name, value in real.items()
        }
        if "rule" in real:  # the rule kernels, made per rule: stubbed once made
            make = real["rule"]
            out["rule"] = lambda *a, **k: (
                None if make(*a, **k) is None else LaunchStub("rule", launches)
            )
        return out

    if not _PATH_MODULES:  # found once: a scan of sys.modules costs more than a step
        importlib.import_module("amopt.torch")
        _PATH_MODULES.extend(
            m
            for name, m in list(sys.modules.items())
            if name.startswith("amopt.torch") and m is not None and hasattr(m, "default_path")
        )
    modules = list(_PATH_MODULES)
    saved_paths = [(m, m.default_path) for m in modules]
    saved_env = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        for m, original in saved_paths:
            m.default_path = _force_triton(original)
        if stub:
            _triton._kernels = kernels
        yield launches
    finally:
        _triton._kernels = original_kernels
        for m, original in saved_paths:
            m.default_path = original
        if saved_env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved_env


class TritonHostCase:
    """One ``step()`` of ``AMAdamW()`` or ``AMSGD()`` on the Triton driver, launches stubbed.

    The parameters are CPU tensors of ``shapes``; the optimizers run their default
    path, routed to the Triton driver by :func:`triton_on_cpu`, so a step is the
    driver's host work alone: the time a GPU waits for before the kernels of a step
    can start. ``run()`` is one step; ``launches`` counts the stubbed launches so far.

    Parameters
    ----------
    optimizer : {"am_adamw", "amsgd"}
        ``AMAdamW(lr=1e-3, weight_decay=1e-2)`` or ``AMSGD(lr=1e-3)``, default flags.
    shapes : list of tuple of int
    dtype : str
        Of the parameters, gradients and state (``"bfloat16"``: half the memory
        of ``"float32"``; the kernels would read either).
    compiled : bool
        Step with ``torch.compile(optimizer.step, fullgraph=True)`` (compiled at the
        first step): the driver then runs inside the ``amopt::triton_*`` operator.
    mesh : DeviceMesh, optional
        Parameters and gradients as ``DTensor``s sharded on dim 0 over this mesh (as
        FSDP2 holds them; see :func:`one_rank_mesh`).
    new_grads : bool
        Two sets of gradients, swapped in by :meth:`new_gradients` (not timed): each
        step then sees gradients at other addresses, as after ``zero_grad()`` or a
        sharded reduction.
    """

    def __init__(
        self,
        optimizer: str,
        shapes: list[tuple[int, ...]],
        dtype: str = "bfloat16",
        *,
        compiled: bool = False,
        mesh: Any = None,
        new_grads: bool = False,
    ) -> None:
        import torch

        from amopt.torch import AMSGD, AMAdamW

        cases.apply_threads()
        dt = getattr(torch, dtype)

        def tensor(shape: tuple[int, ...]) -> Any:
            # untouched memory: the stubbed kernels never read the values
            t = torch.empty(shape, dtype=dt)
            if mesh is None:
                return t
            from torch.distributed.tensor import Shard, distribute_tensor

            return distribute_tensor(t, mesh, [Shard(0)])

        self.params = [torch.nn.Parameter(tensor(s)) for s in shapes]
        self._grad_sets = [[tensor(s) for s in shapes] for _ in range(2 if new_grads else 1)]
        self._next = 0
        self.new_gradients()
        if optimizer == "am_adamw":
            self.optimizer = AMAdamW(self.params, lr=1e-3, weight_decay=1e-2)
        elif optimizer == "amsgd":
            self.optimizer = AMSGD(self.params, lr=1e-3)
        else:
            raise ValueError(f"unknown optimizer {optimizer!r}; expected 'am_adamw' or 'amsgd'")
        self.n_tensors = len(shapes)
        self.launches: Counter[str] = Counter()
        self.step = self.optimizer.step
        if compiled:
            # every optimizer's step is one code object to Dynamo: after the compiled rows
            # run before this one in the process its recompile limit is spent, and a
            # fullgraph compile then refuses to start
            torch._dynamo.reset()
            self.step = torch.compile(self.optimizer.step, fullgraph=True)
        self.run()  # creates the state (and compiles)
        if not self.launches:
            raise RuntimeError(
                f"a step of {type(self.optimizer).__name__}() on CPU tensors under "
                "TRITON_INTERPRET=1 launched no Triton kernel: the Triton driver was not "
                "reached"
            )

    def new_gradients(self) -> None:
        """Give the parameters the next set of gradients (the same one without
        ``new_grads``)."""
        grads = self._grad_sets[self._next % len(self._grad_sets)]
        self._next += 1
        for p, g in zip(self.params, grads, strict=True):
            p.grad = g

    def run(self) -> None:
        with triton_on_cpu() as launches:
            self.step()
        self.launches.update(launches)


@contextlib.contextmanager
def one_rank_mesh() -> Iterator[Any]:
    """A one-rank CPU device mesh (gloo, in this process), for ``DTensor`` stand-ins.

    Initialises the default process group (an in-memory store, world size 1) if none
    is, and destroys it on exit if it made it.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        raise cases.SkipCase("torch.distributed with gloo is not available here")
    from torch.distributed.device_mesh import init_device_mesh

    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (dist.get_world_size(),))
    finally:
        if made:
            dist.destroy_process_group()


# --------------------------------------------------------------------------- op counts


@contextlib.contextmanager
def device_strategy() -> Iterator[bool]:
    """Run the foreach paths on CPU tensors as they run on a GPU, where amopt can.

    ``amopt.torch._common.FORCE_DEVICE_STRATEGY`` (where it exists) makes the foreach
    implementation take the strategy of other devices on the CPU (whole-bucket
    multi-tensor operations instead of cache-sized chunks); yields whether it did.
    """
    from amopt.torch import _common

    if not hasattr(_common, "FORCE_DEVICE_STRATEGY"):
        yield False
        return
    saved = _common.FORCE_DEVICE_STRATEGY
    _common.FORCE_DEVICE_STRATEGY = True
    try:
        yield True
    finally:
        _common.FORCE_DEVICE_STRATEGY = saved


def foreach_step_ops(
    kind: str, shapes: list[tuple[int, ...]], *, as_on_gpu: bool = False
) -> HostReads:
    """The aten operations and synchronisations of one step (the second) of ``kind``.

    ``kind`` is ``"am_adamw_foreach"``, ``"adamw_foreach"``, ``"amsgd_foreach"`` or
    ``"sgd_foreach"`` (:func:`amopt.bench.cases.make_optimizer`, per-layer beta) over
    float32 CPU parameters of ``shapes``; the first step, which creates the state,
    is not counted. ``as_on_gpu``: both steps under :func:`device_strategy`
    (``counter.as_on_gpu`` says whether it applied).
    """
    import torch

    from benchmarks.counters import HostReads

    cases.apply_threads()
    gen = torch.Generator().manual_seed(0)
    params = []
    for s in shapes:
        p = torch.nn.Parameter(torch.randn(s, generator=gen))
        p.grad = 1e-2 * torch.randn(s, generator=gen)
        params.append(p)
    opt = cases.make_optimizer(kind, params, per_layer=True)
    strategy = device_strategy() if as_on_gpu else contextlib.nullcontext(False)
    with strategy as applied:
        opt.step()
        with HostReads() as counter:
            opt.step()
    counter.as_on_gpu = bool(applied)  # type: ignore[attr-defined]
    return counter


def _quadratic(n: int) -> tuple[Any, Any]:
    """``f(x) = 0.5 sum h x^2`` on float64 torch tensors (h in [1e-3, 1]: slow enough
    that no method stops within a few dozen iterations); f is returned as a 0-d tensor,
    so the objective itself reads nothing to the host."""
    import torch

    h = torch.from_numpy(np.geomspace(1e-3, 1.0, n))

    def value_and_grad(x: Any) -> tuple[Any, Any]:
        hx = h * x
        return 0.5 * (hx * x).sum(), hx

    return value_and_grad, torch.ones(n, dtype=torch.float64)


class _TorchLeastSquares:
    """A finite sum on torch tensors: ``f_i(x) = 0.5 (a_i . x - b_i)^2``.

    The mini-batch indices are converted with ``torch.as_tensor`` (no host read).
    """

    def __init__(self, n_samples: int, dim: int) -> None:
        import torch

        gen = torch.Generator().manual_seed(0)
        self.A = torch.randn(n_samples, dim, generator=gen, dtype=torch.float64) / dim**0.5
        self.b = torch.randn(n_samples, generator=gen, dtype=torch.float64)
        self.n_samples = n_samples

    def _vg(self, A: Any, b: Any) -> tuple[Any, Any]:
        r = A @ self.x - b
        return 0.5 * (r * r).mean(), A.T @ r / b.shape[0]

    def value_and_grad(self, x: Any) -> tuple[Any, Any]:
        self.x = x
        return self._vg(self.A, self.b)

    def batch_value_and_grad(self, x: Any, indices: Any) -> tuple[Any, Any]:
        import torch

        idx = torch.as_tensor(indices, device=self.A.device)
        self.x = x
        return self._vg(self.A.index_select(0, idx), self.b.index_select(0, idx))


#: methods of ``amopt.minimize`` counted full batch, and with mini-batches
FULL_BATCH_METHODS = ("gd", "mgd", "am-mgd", "adam", "adamw", "am-adam", "am-adamw")
MINI_BATCH_METHODS = ("sgd", "msgd", "am-sgd", "adam", "adamw", "am-adam", "am-adamw")


def minimize_counts(
    method: str,
    *,
    batch: bool = False,
    n: int = 1000,
    iterations: tuple[int, int] = (4, 12),
    pipelined: bool = False,
) -> dict[str, float]:
    """Host synchronisations and aten operations per iteration of ``amopt.minimize``.

    ``method`` runs on float64 torch CPU tensors, full batch on a quadratic of
    dimension ``n`` or (``batch``) with mini-batches of 32 from a least-squares
    finite sum (512 samples, dimension ``n // 10``), for the two iteration counts of
    ``iterations``; the per-iteration figures are the differences divided by the
    difference of the counts, so that the set-up and the final evaluation cancel.
    ``pipelined``: the loop of an asynchronous device (CUDA, CuPy), which
    reads each iterate while the next step is queued and runs the AM rule there.

    Returns
    -------
    dict
        ``syncs`` and ``ops`` per iteration; ``sites``: the synchronisations of the
        longer run by kind.
    """
    import amopt

    k1, k2 = iterations
    options: dict[str, Any] = {"lr": 1e-2 if method in ("gd", "mgd", "am-mgd") else 1e-3}
    if batch:
        problem = _TorchLeastSquares(512, max(n // 10, 2))
        fun, x0, jac = problem, None, None
        options.update(batch_size=32, seed=0)
        if method in ("adam", "adamw", "am-adam", "am-adamw"):
            options["gtol"] = 0.0
    else:
        fun, x0 = _quadratic(n)
        jac = True
    if x0 is None:
        import torch

        x0 = torch.zeros(problem.A.shape[1], dtype=torch.float64)
    from amopt.optimize import loop as _loop
    from benchmarks.counters import HostReads

    runs = []
    for k in (k1, k2):
        counter = HostReads()
        saved, _loop._PIPELINE = _loop._PIPELINE, pipelined or None
        try:
            with counter:
                res = amopt.minimize(
                    fun, x0, jac=jac, method=method, options={**options, "maxiter": k}
                )
        finally:
            _loop._PIPELINE = saved
        if int(res.nit) != k:
            raise RuntimeError(f"minimize({method!r}) stopped after {res.nit} of {k} iterations")
        runs.append(counter)
    a, b = runs
    return {
        "syncs": (b.syncs - a.syncs) / (k2 - k1),
        "ops": (b.total_ops - a.total_ops) / (k2 - k1),
        "sites": dict(b.sync_sites),
    }
