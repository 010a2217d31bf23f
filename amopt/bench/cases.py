"""The workloads of ``python -m amopt.bench`` and of the asv suite, built in one place.

The harness's own (model layouts of the GPU targets, solver quality) are in
``benchmarks/cases.py`` of the repository.

Every case is a small object with a ``run()`` method doing one unit of work
(one optimizer step, one core step, one training iteration, ...) that the
side-by-side command times, the asv benchmarks time or measure, and the CI
tests run once with small sizes. Nothing here is imported by ``amopt`` itself;
torch, transformers and the LIBSVM files are imported or read only when a case
that needs them is built.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "SkipCase",
    "quick",
    "apply_threads",
    "a9a_path",
    "torch_devices",
    "array_backends",
    "split_sizes",
    "OptimizerCase",
    "ReadFloorCase",
    "OPTIMIZER_KINDS",
    "COMPILED_KINDS",
    "make_optimizer",
    "peak_state_memory",
    "CoreStepCase",
    "MinimizeCase",
    "LlamaCase",
]

#: Set (to anything but "" / "0") to shrink every case: what the CI tests use.
QUICK_ENV = "AMOPT_BENCH_QUICK"
#: Set to a positive integer to run the torch cases with that many threads.
THREADS_ENV = "AMOPT_BENCH_THREADS"


class SkipCase(Exception):
    """A case that cannot run here (missing data set, package or device)."""


def quick() -> bool:
    """True when ``AMOPT_BENCH_QUICK`` asks for small sizes (CI correctness runs)."""
    return os.environ.get(QUICK_ENV, "").strip() not in ("", "0")


def apply_threads() -> None:
    """``torch.set_num_threads($AMOPT_BENCH_THREADS)`` when that variable is set.

    On a machine shared with other work, one thread gives stable per-core ratios;
    with more threads than free cores, OpenMP kernels (torch's and amopt's) slow
    down by large and erratic factors.
    """
    value = os.environ.get(THREADS_ENV, "").strip()
    if value:
        import torch

        torch.set_num_threads(int(value))


def a9a_path() -> Path:
    """The a9a LIBSVM file: ``$AMOPT_A9A``, else ``libsvm/a9a`` in the data folder.

    The data folder is ``$AMOPT_DATA_DIR`` (default ``~/.cache/amopt``), the one
    :mod:`amopt.datasets` and ``python -m amopt.bench --data-dir`` use.
    """
    env = os.environ.get("AMOPT_A9A")
    if env:
        return Path(env)
    from amopt.datasets import get_data_home

    return get_data_home() / "libsvm" / "a9a"


def torch_devices() -> list[str]:
    """``["cpu"]``, plus ``"cuda"`` when torch sees a GPU; ``[]`` without torch."""
    try:
        import torch
    except ImportError:
        return []
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def array_backends() -> list[str]:
    """Array backends of the core benchmarks available here: numpy, torch, cupy, torch-cuda."""
    from amopt.backends import library_available

    names = ["numpy"]
    if library_available("torch"):
        names.append("torch")
        if "cuda" in torch_devices():
            names.append("torch-cuda")
    if library_available("cupy"):
        names.append("cupy")
    return names


def split_sizes(n_params: int, n_tensors: int) -> list[int]:
    """``n_params`` split into ``n_tensors`` sizes differing by at most one."""
    base, extra = divmod(n_params, n_tensors)
    return [base + (1 if k < extra else 0) for k in range(n_tensors)]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


# --------------------------------------------------------------------------- torch optimizers

#: kind -> the optimizer it builds
OPTIMIZER_KINDS: dict[str, str] = {
    "am_adamw_default": "AMAdamW() (default flags)",
    "am_adamw_fused": "AMAdamW(fused=True)",
    "am_adamw_fused_amp": "AMAdamW(fused=True), stepped with a GradScaler's scale",
    "am_adamw_foreach": "AMAdamW(foreach=True)",
    "am_adamw_compiled": "AMAdamW(), step under torch.compile",
    "adamw_default": "torch.optim.AdamW() (default flags)",
    "adamw_fused": "torch.optim.AdamW(fused=True)",
    "adamw_fused_amp": "torch.optim.AdamW(fused=True), stepped with a GradScaler's scale",
    "adamw_foreach": "torch.optim.AdamW(foreach=True)",
    "adamw_compiled": "torch.optim.AdamW(), step under torch.compile",
    "amsgd_default": "AMSGD() (default flags)",
    "amsgd_fused": "AMSGD(fused=True)",
    "amsgd_foreach": "AMSGD(foreach=True)",
    "sgd_default": "torch.optim.SGD(momentum=0.9, dampening=0.9) (default flags)",
    "sgd_foreach": "torch.optim.SGD(momentum=0.9, dampening=0.9, foreach=True)",
}


#: kind -> the optimizer it builds, its step under ``torch.compile`` (the compiled rows
#: of the explicit paths; compiling takes long, so the CI runs only one of them)
COMPILED_KINDS: dict[str, str] = {
    f"{name}_{path}_compiled": f"{label}(foreach={path == 'foreach'}), step under torch.compile"
    for name, label in (
        ("am_adamw", "AMAdamW"),
        ("adamw", "torch.optim.AdamW"),
        ("amsgd", "AMSGD"),
        ("sgd", "torch.optim.SGD(momentum=0.9, dampening=0.9)"),
    )
    for path in ("single", "foreach")
}


def make_optimizer(kind: str, params: list[Any], per_layer: bool) -> Any:
    """The optimizer of ``kind`` (a key of :data:`OPTIMIZER_KINDS` or :data:`COMPILED_KINDS`)
    over ``params``.

    All with ``lr=1e-3``; the Adam family with ``weight_decay=1e-2`` (AdamW's
    default); ``per_layer`` is the beta scope of the AM optimizers.
    """
    import torch

    from amopt.torch import AMSGD, AMAdamW

    if kind in COMPILED_KINDS:
        name, path, _ = kind.rsplit("_", 2)
        flag = {"foreach": path == "foreach"}
        if name == "am_adamw":
            return AMAdamW(params, lr=1e-3, weight_decay=1e-2, per_layer=per_layer, **flag)
        if name == "adamw":
            return torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-2, **flag)
        if name == "amsgd":
            return AMSGD(params, lr=1e-3, per_layer=per_layer, **flag)
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, dampening=0.9, **flag)
    if kind in ("am_adamw_default", "am_adamw_compiled"):
        return AMAdamW(params, lr=1e-3, weight_decay=1e-2, per_layer=per_layer)
    if kind in ("adamw_default", "adamw_compiled"):
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-2)
    if kind == "amsgd_default":
        return AMSGD(params, lr=1e-3, per_layer=per_layer)
    if kind == "sgd_default":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, dampening=0.9)
    if kind in ("am_adamw_fused", "am_adamw_fused_amp"):
        return AMAdamW(params, lr=1e-3, weight_decay=1e-2, per_layer=per_layer, fused=True)
    if kind == "am_adamw_foreach":
        return AMAdamW(params, lr=1e-3, weight_decay=1e-2, per_layer=per_layer, foreach=True)
    if kind in ("adamw_fused", "adamw_fused_amp"):
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-2, fused=True)
    if kind == "adamw_foreach":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-2, foreach=True)
    if kind == "amsgd_fused":
        return AMSGD(params, lr=1e-3, per_layer=per_layer, fused=True)
    if kind == "amsgd_foreach":
        return AMSGD(params, lr=1e-3, per_layer=per_layer, foreach=True)
    if kind == "sgd_foreach":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, dampening=0.9, foreach=True)
    raise ValueError(
        f"unknown optimizer kind {kind!r}; expected one of {[*OPTIMIZER_KINDS, *COMPILED_KINDS]}"
    )


class OptimizerCase:
    """``n_params`` float32 parameters in ``n_tensors`` tensors with fixed gradients.

    ``run()`` is one ``optimizer.step()`` (with a device synchronisation on CUDA).
    The gradients are set once; the parameters move a little at every step,
    which does not change the cost of a step. The ``*_amp`` kinds step as under
    ``torch.amp.GradScaler``: with the optimizer's ``grad_scale`` (1024) and
    ``found_inf`` (0) set, so that the step unscales the gradients itself.

    Parameters
    ----------
    kind : str
        A key of :data:`OPTIMIZER_KINDS` or :data:`COMPILED_KINDS`.
    n_params, n_tensors : int
        Total size and number of parameter tensors.
    per_layer : bool
        Beta scope of the AM optimizers (ignored by torch's).
    device : str
        ``"cpu"`` or ``"cuda"``.
    seed : int
        Seed of the parameter and gradient values (the same for every kind).
    """

    def __init__(
        self,
        kind: str,
        n_params: int,
        n_tensors: int,
        *,
        per_layer: bool = True,
        device: str = "cpu",
        seed: int = 0,
    ) -> None:
        import torch

        if device not in torch_devices():
            raise SkipCase(f"torch device {device!r} is not available")
        apply_threads()
        gen = torch.Generator().manual_seed(seed)
        self.device = device
        self.params = []
        for size in split_sizes(n_params, n_tensors):
            p = torch.nn.Parameter(torch.randn(size, generator=gen).to(device))
            p.grad = (1e-2 * torch.randn(size, generator=gen)).to(device)
            self.params.append(p)
        self.optimizer = make_optimizer(kind, self.params, per_layer)
        if kind.endswith("_amp"):  # what GradScaler.step sets for a fused optimizer
            self.optimizer.grad_scale = torch.tensor(1024.0, device=device)
            self.optimizer.found_inf = torch.tensor(0.0, device=device)
        self._step: Callable[[], Any] = self.optimizer.step
        if kind.endswith("_compiled"):
            # PyTorch's "Compiling the optimizer" recipe: compile a function that steps
            self._step = torch.compile(self.optimizer.step)

    def run(self) -> None:
        self._step()
        _sync(self.device)

    def state_bytes(self) -> int:
        """Bytes held in the optimizer state (every tensor of ``optimizer.state``)."""
        import torch

        seen: set[int] = set()
        total = 0
        for state in self.optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    storage = value.untyped_storage()
                    key = storage.data_ptr()
                    if key not in seen:
                        seen.add(key)
                        total += storage.nbytes()
        return total


class TrafficCase:
    """The memory traffic of a fused AMAdamW step without its arithmetic.

    ``run()`` is :func:`amopt.torch._fused.adam_traffic` on the parameters, gradients
    and states of an ``AMAdamW(fused=True)`` :class:`OptimizerCase` (stepped once to
    create its state): the two passes of the fused step, in its order and chunks, with
    no square root, division or rule. Its time is a floor for any two-pass step over
    these tensors on this machine.
    """

    def __init__(
        self, n_params: int, n_tensors: int, *, per_layer: bool = True, seed: int = 0
    ) -> None:
        case = OptimizerCase("am_adamw_fused", n_params, n_tensors, per_layer=per_layer, seed=seed)
        case.run()
        opt = case.optimizer
        group = opt.param_groups[0]
        self.case, self.per_layer = case, per_layer
        self.tensors = (
            list(group["params"]),
            [p.grad for p in group["params"]],
            [opt.state[p]["exp_avg"] for p in group["params"]],
            [opt.state[p]["exp_avg_sq"] for p in group["params"]],
        )
        # the numerator's weight-decay sums read the parameters in the first pass
        self.has_x = group["weight_decay"] != 0 and group["weight_decay_mode"] != "l2"

    def run(self) -> None:
        from amopt.torch._fused import adam_traffic

        adam_traffic(*self.tensors, per_layer=self.per_layer, has_x=self.has_x)


class ReadFloorCase:
    """The memory-traffic floor of a compiled AMSGD step, built from a compiled SGD step.

    An AM step reads the gradients and the momentum buffers once before its apply (the
    reduce, which the rule waits for: a second pass for a global scope), and its
    apply moves what SGD's step moves. ``run()`` is a compiled pass that reads every
    gradient and buffer of a compiled ``SGD(momentum=0.9, dampening=0.9,
    foreach=False)`` :class:`OptimizerCase` (stepped once to create its buffers),
    followed by that case's compiled step: on the same tensors, the least any two-pass
    AMSGD step can cost on this machine.
    """

    def __init__(self, n_params: int, n_tensors: int, *, seed: int = 0) -> None:
        import torch

        self.case = OptimizerCase("sgd_single_compiled", n_params, n_tensors, seed=seed)
        self.case.run()
        opt = self.case.optimizer
        params = opt.param_groups[0]["params"]
        self.grads = [p.grad for p in params]
        self.bufs = [opt.state[p]["momentum_buffer"] for p in params]

        def read(grads: list, bufs: list) -> Any:
            # one product per element: the pass costs its reads, not its arithmetic
            return torch.stack([(g * d).sum() for g, d in zip(grads, bufs, strict=True)])

        self._read = torch.compile(read)

    def run(self) -> None:
        self._read(self.grads, self.bufs)
        self.case.run()


def peak_state_memory(kind: str, n_params: int, n_tensors: int, per_layer: bool) -> dict:
    """Run in a fresh process: bytes the optimizer adds to the peak resident memory.

    Parameters and gradients are allocated (and touched) first; the result is the
    peak resident set size after three steps minus the resident size before the
    optimizer existed, and the bytes of the optimizer state. Linux only
    (``/proc/self/status``).
    """
    import gc

    def rss(field: str) -> int:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"{field} not in /proc/self/status")

    case = OptimizerCase(kind, n_params, n_tensors, per_layer=per_layer)
    opt = case.optimizer
    params = case.params
    gc.collect()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")  # reset VmHWM to the current resident size
    before = rss("VmHWM:")
    for _ in range(3):
        opt.step()
    after = rss("VmHWM:")
    del params
    return {"peak_extra_bytes": after - before, "state_bytes": case.state_bytes()}


# --------------------------------------------------------------------------- array-API core


class CoreStepCase:
    """One step of the array-API core on ``n`` float64 elements.

    ``method`` ``"am-mgd"``: :func:`amopt.am_momentum_step` with the exact
    numerator (the AM-MGD configuration of ``minimize``); ``"mgd"``:
    :func:`amopt.heavy_ball_step` with ``beta = 0.9``. Both are pure
    functions: the new arrays are discarded.

    Parameters
    ----------
    method : {"am-mgd", "mgd"}
    n : int
    backend : {"numpy", "torch", "torch-cuda", "cupy"}
    """

    def __init__(self, method: str, n: int, backend: str = "numpy", seed: int = 0) -> None:
        from amopt.optimize import steps as _core

        rng = np.random.default_rng(seed)
        host = [rng.standard_normal(n) for _ in range(3)]
        self.sync: Callable[[], None] = lambda: None
        if backend == "numpy":
            arrays = host
        elif backend in ("torch", "torch-cuda"):
            import torch

            device = "cuda" if backend == "torch-cuda" else "cpu"
            if device not in torch_devices():
                raise SkipCase(f"{backend} is not available")
            apply_threads()
            arrays = [torch.from_numpy(a).to(device) for a in host]
            if device == "cuda":
                self.sync = torch.cuda.synchronize
        elif backend == "cupy":
            if "cupy" not in array_backends():
                raise SkipCase("cupy with a GPU is not available")
            import cupy

            arrays = [cupy.asarray(a) for a in host]
            self.sync = cupy.cuda.Device().synchronize
        else:
            raise ValueError(f"unknown backend {backend!r}")
        self.x, self.g, d = arrays
        self.method = method
        if method == "am-mgd":
            self.state = _core.AMState(step=1, d=(d,), f_prev=1.0)
            self._step = lambda: _core.am_momentum_step(
                self.x, self.g, self.state, lr=1e-3, f=0.5, numerator="exact"
            )
        elif method == "mgd":
            self.state = _core.HeavyBallState(step=1, d=(d,))
            self._step = lambda: _core.heavy_ball_step(
                self.x, self.g, self.state, lr=1e-3, beta=0.9
            )
        else:
            raise ValueError(f"unknown method {method!r}; expected 'am-mgd' or 'mgd'")

    def run(self) -> None:
        self._step()
        self.sync()


# --------------------------------------------------------------------------- minimize vs a loop


@functools.lru_cache(maxsize=2)
def _a9a_problem(path: str) -> Any:
    """The a9a logistic regression (parsed once per process)."""
    from amopt.problems import LogisticRegression

    if not Path(path).is_file():
        raise SkipCase(f"a9a not found at {path} (set AMOPT_A9A to its path)")
    return LogisticRegression.from_libsvm(path, n_features=123)


class MinimizeCase:
    """``iterations`` iterations on a9a logistic regression (lr = 1/L).

    ``method="am-mgd"``: ``amopt.minimize(method="am-mgd")`` (``gtol = 0``, so it
    runs exactly ``iterations`` steps). ``method="heavy-ball"``: the loop a user
    would write by hand in NumPy (``f, g = value_and_grad(x)``;
    ``d = 0.9 d + 0.1 g``; ``x = x - lr d``; and the objective at the last iterate,
    which ``minimize`` reports: both evaluate it ``iterations + 1`` times). Both
    start from the same point near the minimiser (the cached L-BFGS-B reference
    solution plus a fixed perturbation of size 1e-2), so that their objective
    evaluations cost the same: the cost of the LIBSVM logistic loss depends on the
    iterate (it is cheapest at ``x = 0``), and two methods started at 0 would be
    timed on different work.
    """

    def __init__(self, method: str, iterations: int = 200) -> None:
        self.problem = _a9a_problem(str(a9a_path()))
        sol = self.problem.reference_solution()
        rng = np.random.default_rng(0)
        self.x0 = np.asarray(sol.x, dtype=np.float64) + 1e-2 * rng.standard_normal(
            self.problem.dim
        )
        self.lr = 1.0 / self.problem.L
        self.iterations = iterations
        if method not in ("am-mgd", "heavy-ball"):
            raise ValueError(f"unknown method {method!r}; expected 'am-mgd' or 'heavy-ball'")
        self.method = method

    def run(self) -> Any:
        vg = self.problem.value_and_grad
        if self.method == "am-mgd":
            import amopt

            return amopt.minimize(
                vg,
                self.x0,
                jac=True,
                method="am-mgd",
                options={"lr": self.lr, "maxiter": self.iterations, "gtol": 0.0},
            ).x
        lr = self.lr
        x = self.x0.copy()
        d = None
        for _ in range(self.iterations):
            _, g = vg(x)
            d = g if d is None else 0.9 * d + 0.1 * g
            x = x - lr * d
        vg(x)  # the objective at the last iterate, which minimize evaluates and reports
        return x


# --------------------------------------------------------------------------- tiny LLaMA


#: The implementations :class:`LlamaCase` can ask both optimizers for.
LLAMA_PATHS = ("fused", "foreach", "default", "compiled")


class LlamaCase:
    """A training iteration of a tiny LLaMA (``transformers``, built from a config).

    ``run()`` = ``zero_grad``, forward with labels, backward, ``step``. The
    default model has 7.4M parameters in 39 tensors (vocabulary 8192, width 256,
    4 layers, 4 heads) and a batch of 16 sequences of 256 tokens (4096 tokens per
    step, about 560 per thousand parameters; the paper's LLaMA runs use more).

    Parameters
    ----------
    optimizer : {"adamw", "am-adamw"}
        ``torch.optim.AdamW`` or ``AMAdamW`` (per-layer beta, the paper's LLM
        setting), both with ``lr=1e-3, weight_decay=1e-2``.
    path : {"fused", "foreach", "default", "compiled"}
        The implementation both optimizers are asked for (``"default"``: no flag;
        ``"compiled"``: no flag, ``step`` under ``torch.compile``; the model itself
        runs eagerly in every case).
    """

    def __init__(
        self,
        optimizer: str,
        *,
        batch: int = 16,
        seq_len: int = 256,
        hidden: int = 256,
        layers: int = 4,
        vocab: int = 8192,
        seed: int = 0,
        path: str = "fused",
    ) -> None:
        if path not in LLAMA_PATHS:
            raise ValueError(f"path must be one of {LLAMA_PATHS}; got path={path!r}")
        try:
            from transformers import LlamaConfig, LlamaForCausalLM
        except ImportError as exc:
            raise SkipCase(f"transformers is not installed ({exc})") from None
        import torch

        from amopt.torch import AMAdamW

        apply_threads()
        config = LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=int(hidden * 2.6875),
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=seq_len,
            tie_word_embeddings=False,
        )
        torch.manual_seed(seed)
        self.model = LlamaForCausalLM(config)
        self.model.train()
        gen = torch.Generator().manual_seed(seed + 1)
        self.ids = torch.randint(0, vocab, (batch, seq_len), generator=gen)
        params = list(self.model.parameters())
        flags = {} if path in ("default", "compiled") else {path: True}
        if optimizer == "adamw":
            self.optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-2, **flags)
        elif optimizer == "am-adamw":
            self.optimizer = AMAdamW(params, lr=1e-3, weight_decay=1e-2, **flags)
        else:
            raise ValueError(f"unknown optimizer {optimizer!r}; expected 'adamw' or 'am-adamw'")
        self._step: Callable[[], Any] = self.optimizer.step
        if path == "compiled":  # as in PyTorch's "Compiling the optimizer" recipe
            self._step = torch.compile(self.optimizer.step)
        self.n_params = sum(p.numel() for p in params)
        self.n_tensors = len(params)
        self.fb_seconds: list[float] = []
        self.step_seconds: list[float] = []

    def run(self) -> float:
        """One iteration; returns the loss.

        ``fb_seconds`` and ``step_seconds`` record the time of its ``zero_grad`` +
        forward + backward, and of its ``step``.
        """
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.model(input_ids=self.ids, labels=self.ids).loss
        loss.backward()
        mid = time.perf_counter()
        self._step()
        end = time.perf_counter()
        self.fb_seconds.append(mid - start)
        self.step_seconds.append(end - mid)
        return float(loss.detach())
