"""GPU rows of ``python -m benchmarks --gpu``: the GPU targets, "no GPU" where there is none.

Every row skips with a reason starting "no GPU" without a CUDA device, and reports
an error (and the next row runs) where the feature it measures fails. Each row
takes at most about ``Settings.row_seconds`` of timed pairs (``--gpu`` sets it) after
its warm-up steps; the compiled and FSDP2 rows run in a child process with a time
limit. Rows, AM side / baseline (target):

* ``gpu-gpt2-bf16-fused``, ``gpu-gpt2-bf16``, ``gpu-gpt2-fp32-fused``,
  ``gpu-gpt2-fp32``: one eager step of ``AMAdamW()`` (default flags: the Triton
  kernels) against ``AdamW(fused=True)`` (bf16: <= 1.5; fp32: information) and
  ``AdamW()`` (<= 1.0), GPT-2 small (124M parameters in 148 tensors);
* ``gpu-host-adamw``, ``gpu-host-adamw-1480``, ``gpu-host-amsgd``,
  ``gpu-host-amsgd-1480``: the host time of ``step()`` (until it returns, the GPU
  idle before each sample) of ``AMAdamW()`` / ``AMSGD()`` against
  ``AdamW(fused=True)``, at 148 tensors and with the same parameters in 1480 (<= 1.5);
* ``gpu-graph`` (after the other rows of this process: a failed capture can leave
  the CUDA context unusable): a CUDA-graph replay of ``AMAdamW(capturable=True).step`` against
  ``AdamW(fused=True, capturable=True)`` (<= 1.3);
* ``gpu-compiled``: ``torch.compile`` of ``AMAdamW().step`` against that of
  ``AdamW().step``, GPT-2 small's embeddings and first 4 blocks (52 tensors: the
  compilation of the 148-tensor step takes a minute; <= 1.5);
* ``gpu-1b-bf16``: ``AMAdamW()`` against ``AdamW(fused=True)``, 1.24B bf16
  parameters (Llama-3.2-1B shapes; <= 1.3);
* ``gpu-amsgd``: ``AMSGD()`` against ``SGD(momentum=0.9)`` (<= 1.3);
* ``gpu-foreach``: ``AMAdamW(foreach=True)`` against ``AdamW(foreach=True)``
  (information);
* ``gpu-fsdp2``: the optimizer step on FSDP2 parameters (``fully_shard`` per block,
  world size 1, NCCL), ``AMAdamW()`` against ``AdamW(fused=True)`` (<= 1.5);
* ``gpu-gpt2-train``: a training iteration of ``transformers``' ``GPT2LMHeadModel``
  (bf16 autocast, float32 parameters, batch 8 x 1024 as in the issue that set its
  target), ``AMAdamW()`` against ``AdamW(fused=True)`` (<= 1.005);
* ``gpu-quad-mgd``, ``gpu-quad-am-mgd``: ``minimize(method="mgd" / "am-mgd")`` per
  iteration on a 10^7 float64 CuPy quadratic against a hand-written CuPy heavy-ball
  loop that reads f to the host once per iteration (<= 1.1, <= 1.3);
  ``gpu-quad-am-mgd-torch`` (informational): the am-mgd row on torch CUDA tensors
  against the same loop in torch;
* ``gpu-libsvm``: ``minimize(method="am-mgd")`` per iteration on a9a logistic
  regression (a SciPy sparse design) from a CuPy ``x0`` against a NumPy ``x0``
  (<= 1.0: faster on the GPU; the file from ``--data-dir``, as the ``minimize-a9a``
  row);
* ``gpu-am-sgd-256``, ``gpu-am-sgd-4096``: ``minimize(method="am-sgd")`` per
  iteration, batch 256 and 4096, dense 200,000 x 500 logistic regression, CuPy
  against NumPy (<= 1.0); the full evaluation that ends a mini-batch run (one pass
  over all rows, longer than a hundred iterations on the host) is timed apart and
  not counted; ``gpu-am-sgd-256-hand`` (informational): the same at batch 256 against
  a hand-written CuPy mini-batch heavy-ball loop (:class:`HandMiniBatch`), what the
  GPU costs a user's own loop at that batch.

Examples
--------
>>> import math
>>> from benchmarks.gpu import gpt2_small_shapes
>>> sum(math.prod(s) for s in gpt2_small_shapes())
124439808
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from amopt.backends import library_available
from amopt.bench import cases
from amopt.bench._records import Measured, Row, Settings
from amopt.bench._timing import Paired, PhaseClock, interleave, interleave_counted, timed_rounds
from benchmarks import cases as layouts
from benchmarks import child_env
from benchmarks.cases import gpt2_small_shapes, llama_1b_shapes

__all__ = [
    "GPU_KINDS",
    "GpuAdamCase",
    "GpuStepCase",
    "ROWS",
    "gpt2_small_shapes",
    "gpu_rows",
    "llama_1b_shapes",
]

#: seconds a child process (compiled, FSDP2 rows) may take, warm-up and compilation included
CHILD_TIMEOUT = {"compiled": 150, "fsdp2": 90}


def require_cuda() -> Any:
    """``torch`` when it sees a CUDA device, else :class:`~amopt.bench.cases.SkipCase`
    with a reason starting "no GPU"."""
    try:
        import torch
    except ImportError:
        raise cases.SkipCase("no GPU: torch is not installed") from None
    if not torch.cuda.is_available():
        raise cases.SkipCase("no GPU: torch.cuda.is_available() is False")
    return torch


def require_cupy() -> Any:
    """``cupy`` with a GPU, else :class:`~amopt.bench.cases.SkipCase` ("no GPU: ...")."""
    # the registry probes CuPy (installed, a visible device) once per process
    if not library_available("cupy"):
        raise cases.SkipCase("no GPU: cupy is not installed or sees no device")
    import cupy

    return cupy


def _shapes(name: str, quick: bool) -> list[tuple[int, ...]]:
    shapes = {
        "gpt2": gpt2_small_shapes,
        "gpt2-1480": lambda: layouts.many_tensor_shapes(gpt2_small_shapes(), 10),
        "1b": llama_1b_shapes,
        # embeddings, the first 4 of the 12 blocks, final norm: 52 tensors (compiling
        # torch's AdamW over all 148 takes about a minute on a 16-core host)
        "gpt2-4": lambda: gpt2_small_shapes()[: 2 + 4 * 12] + gpt2_small_shapes()[-2:],
    }[name]()
    return layouts.shrunk_shapes(shapes) if quick else shapes


def _am_path(torch: Any, params: list[Any]) -> str:
    """Which implementation the AM optimizers' default flags pick for ``params``."""
    from amopt.torch._common import default_path

    path, reason = default_path(params, params, fused=None, foreach=None)
    return path if reason is None else f"{path} ({reason})"


#: kind -> the optimizer :class:`GpuStepCase` builds
GPU_KINDS: dict[str, str] = {
    "am_adamw": "AMAdamW() (default flags)",
    "am_adamw_foreach": "AMAdamW(foreach=True)",
    "am_adamw_capturable": "AMAdamW(capturable=True)",
    "am_adamw_compiled": "AMAdamW(), step under torch.compile",
    "adamw": "torch.optim.AdamW() (default flags)",
    "adamw_fused": "torch.optim.AdamW(fused=True)",
    "adamw_foreach": "torch.optim.AdamW(foreach=True)",
    "adamw_fused_capturable": "torch.optim.AdamW(fused=True, capturable=True)",
    "adamw_compiled": "torch.optim.AdamW(), step under torch.compile",
    "amsgd": "AMSGD() (default flags)",
    "sgd": "torch.optim.SGD(momentum=0.9) (default flags)",
}


def _optimizer(kind: str, params: list[Any]) -> Any:
    import torch

    from amopt.torch import AMSGD, AMAdamW

    wd = {"lr": 1e-3, "weight_decay": 1e-2}
    table: dict[str, Callable[[], Any]] = {
        "am_adamw": lambda: AMAdamW(params, **wd),
        "am_adamw_foreach": lambda: AMAdamW(params, foreach=True, **wd),
        "am_adamw_capturable": lambda: AMAdamW(params, capturable=True, **wd),
        "am_adamw_compiled": lambda: AMAdamW(params, **wd),
        "adamw": lambda: torch.optim.AdamW(params, **wd),
        "adamw_fused": lambda: torch.optim.AdamW(params, fused=True, **wd),
        "adamw_foreach": lambda: torch.optim.AdamW(params, foreach=True, **wd),
        "adamw_fused_capturable": lambda: torch.optim.AdamW(
            params, fused=True, capturable=True, **wd
        ),
        "adamw_compiled": lambda: torch.optim.AdamW(params, **wd),
        "amsgd": lambda: AMSGD(params, lr=1e-3),
        "sgd": lambda: torch.optim.SGD(params, lr=1e-3, momentum=0.9),
    }
    if kind not in table:
        raise ValueError(f"unknown kind {kind!r}; expected one of {list(GPU_KINDS)}")
    return table[kind]()


def gpu_params(shapes: list[tuple[int, ...]], dtype: str, seed: int = 0) -> list[Any]:
    """Parameters of ``shapes`` on the GPU with fixed gradients (shared by both sides)."""
    torch = require_cuda()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    params = []
    for s in shapes:
        p = torch.nn.Parameter(torch.randn(s, generator=gen, device="cuda", dtype=dt))
        p.grad = 1e-2 * torch.randn(s, generator=gen, device="cuda", dtype=dt)
        params.append(p)
    return params


class GpuStepCase:
    """One optimizer step of ``kind`` (a key of :data:`GPU_KINDS`) over ``params``.

    ``run()`` is a step and a device synchronisation (the step's time on the GPU);
    ``host()`` synchronises, then times ``step()`` until it returns (the host's time,
    what a GPU idles for when the host is the bottleneck). The ``*_capturable``
    kinds capture one step in a CUDA graph (after three warm-up steps on a side
    stream) and ``run()`` replays it; the ``*_compiled`` kinds step under
    ``torch.compile``.
    """

    def __init__(self, kind: str, params: list[Any]) -> None:
        import torch

        self.kind, self.params = kind, params
        self.optimizer = _optimizer(kind, params)
        self._step: Callable[[], Any] = self.optimizer.step
        if kind.endswith("_compiled"):
            self._step = torch.compile(self.optimizer.step)
        self.graph = None
        if kind.endswith("_capturable"):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    self.optimizer.step()
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.optimizer.step()
            self._step = self.graph.replay
        torch.cuda.synchronize()

    def run(self) -> None:
        import torch

        self._step()
        torch.cuda.synchronize()

    def host(self) -> dict[str, float]:
        import torch

        torch.cuda.synchronize()
        start = time.perf_counter()
        self._step()
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
        return {"total": elapsed}


def _note(torch: Any, params: list[Any], extra: str = "") -> str:
    n = sum(p.numel() for p in params)
    dtype = str(params[0].dtype).replace("torch.", "")
    return (
        f"{n:,} {dtype} params in {len(params)} tensors; AM default path: "
        f"{_am_path(torch, params)}; {torch.cuda.get_device_name()}{extra}"
    )


def _eager(kind_a: str, kind_b: str, shapes: str, dtype: str) -> Callable[[Settings], Measured]:
    def measure(s: Settings) -> Measured:
        torch = require_cuda()
        params = gpu_params(_shapes(shapes, s.quick), dtype)
        a, b = GpuStepCase(kind_a, params), GpuStepCase(kind_b, params)
        p = interleave(a.run, b.run, repeat=s.repeat, warmup=3, max_seconds=s.row_seconds)
        note = _note(torch, params, f"; {len(p.a)} pairs")
        out = Measured.from_paired(p, scale=1e3, unit="ms", note=note)
        del a, b, params
        torch.cuda.empty_cache()
        return out

    return measure


def _host(kind_a: str, kind_b: str, shapes: str) -> Callable[[Settings], Measured]:
    def measure(s: Settings) -> Measured:
        torch = require_cuda()
        params = gpu_params(_shapes(shapes, s.quick), "bfloat16")
        a, b = GpuStepCase(kind_a, params), GpuStepCase(kind_b, params)
        out = timed_rounds(
            {"a": a.host, "b": b.host},
            rounds=s.repeat,
            warmup=3,
            max_seconds=s.row_seconds,
        )
        p = Paired(a=out["a"]["total"], b=out["b"]["total"])
        note = _note(torch, params, f"; host time until step() returns, {len(p.a)} pairs")
        return Measured.from_paired(p, scale=1e3, unit="ms", note=note)

    return measure


# --------------------------------------------------------------------------- child processes


def _child(name: str, settings: Settings, timeout: float) -> Measured:
    """Run ``_child_<name>(settings)`` in a fresh Python process; its Measured back."""
    code = (
        "import json, sys\n"
        "from benchmarks import gpu as _gpu\n"
        "from amopt.bench._records import Settings\n"
        f"s = Settings(**json.loads({json.dumps(json.dumps(settings.__dict__))}))\n"
        f"m = _gpu._child_{name}(s)\n"
        "print('@@MEASURED ' + json.dumps(m.__dict__))\n"
    )
    env = child_env(PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the {name} child process took over {timeout:g} s") from None
    lines = [x for x in proc.stdout.splitlines() if x.startswith("@@MEASURED ")]
    if proc.returncode != 0 or not lines:
        if "SkipCase" in proc.stderr:
            raise cases.SkipCase(proc.stderr.strip().splitlines()[-1].split(": ", 1)[-1])
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"the {name} child process failed: {tail}")
    data = json.loads(lines[-1][len("@@MEASURED ") :])
    if data.get("spread") is not None:
        data["spread"] = tuple(data["spread"])
    return Measured(**data)


def _child_compiled(s: Settings) -> Measured:
    """Compiled ``AMAdamW().step`` against compiled ``AdamW().step``, 4 GPT-2 blocks, bf16."""
    torch = require_cuda()
    params = gpu_params(_shapes("gpt2-4", s.quick), "bfloat16")
    started = time.perf_counter()
    a = GpuStepCase("am_adamw_compiled", params)
    a.run()
    a.run()
    compile_a = time.perf_counter() - started
    started = time.perf_counter()
    b = GpuStepCase("adamw_compiled", params)
    b.run()
    b.run()
    compile_b = time.perf_counter() - started
    p = interleave(a.run, b.run, repeat=s.repeat, warmup=1, max_seconds=s.row_seconds)
    return Measured.from_paired(
        p,
        scale=1e3,
        unit="ms",
        note=_note(
            torch,
            params,
            f"; first two steps (compilation) {compile_a:.0f} s and {compile_b:.0f} s; "
            f"{len(p.a)} pairs",
        ),
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _child_fsdp2(s: Settings) -> Measured:
    """The optimizer step on FSDP2 parameters: one process, NCCL, fully_shard per block."""
    torch = require_cuda()
    import torch.distributed as dist

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch before 2.6
        from torch.distributed._composable.fsdp import fully_shard
    if not dist.is_nccl_available():
        raise cases.SkipCase("NCCL is not available in this torch build")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    try:
        shapes = _shapes("gpt2", s.quick)
        d = shapes[0][1]
        blocks = [shapes[2 + 12 * k : 14 + 12 * k] for k in range(12)]

        class Block(torch.nn.Module):
            def __init__(self, block_shapes: list[tuple[int, ...]]) -> None:
                super().__init__()
                self.weights = torch.nn.ParameterList(
                    torch.nn.Parameter(1e-2 * torch.randn(sh, device="cuda"))
                    for sh in block_shapes
                )

            def forward(self, x: Any) -> Any:
                return x + sum(w.mean() for w in self.weights)

        class Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = torch.nn.ParameterList(
                    torch.nn.Parameter(1e-2 * torch.randn(sh, device="cuda"))
                    for sh in (*shapes[:2], *shapes[-2:])
                )
                self.blocks = torch.nn.ModuleList(Block(b) for b in blocks)

            def forward(self, x: Any) -> Any:
                x = x + sum(w.mean() for w in self.embed)
                for block in self.blocks:
                    x = block(x)
                return x

        model = Model()
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        model(torch.ones(d, device="cuda")).sum().backward()
        params = list(model.parameters())
        a = GpuStepCase("am_adamw", params)
        try:
            b = GpuStepCase("adamw_fused", params)
            baseline = "AdamW(fused=True)"
        except Exception as exc:  # noqa: BLE001 - say which baseline ran instead
            b = GpuStepCase("adamw_foreach", params)
            baseline = f"AdamW(foreach=True) (fused: {type(exc).__name__}: {exc})"
        p = interleave(a.run, b.run, repeat=s.repeat, warmup=3, max_seconds=s.row_seconds)
        n = sum(p_.numel() for p_ in params)
        return Measured.from_paired(
            p,
            scale=1e3,
            unit="ms",
            note=f"{n:,} float32 params in {len(params)} DTensors (fully_shard per block, "
            f"world size 1); baseline {baseline}; {torch.cuda.get_device_name()}; "
            f"{len(p.a)} pairs",
        )
    finally:
        dist.destroy_process_group()


def _in_child(name: str) -> Callable[[Settings], Measured]:
    def measure(s: Settings) -> Measured:
        require_cuda()
        return _child(name, s, CHILD_TIMEOUT[name])

    return measure


# --------------------------------------------------------------------------- GPT-2 training


def _gpt2_train(s: Settings) -> Measured:
    """GPT2LMHeadModel training iterations with AMAdamW() and AdamW(fused=True).

    One model, two optimizers over its parameters, alternately; each iteration is
    zero_grad + forward and backward under bf16 autocast, then one optimizer's step,
    each phase timed after a device synchronisation. The iteration of each side is
    the pooled median forward+backward time plus that side's median step time, as in
    the tiny-LLaMA row.
    """
    torch = require_cuda()
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as exc:
        raise cases.SkipCase(f"transformers is not installed ({exc})") from None
    torch.manual_seed(0)
    if s.quick:
        config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=128)
        batch, seq = 2, 64
    else:
        config = GPT2Config()  # GPT-2 small
        batch, seq = 8, 1024
    model = GPT2LMHeadModel(config).cuda().train()
    gen = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda", generator=gen)
    params = list(model.parameters())
    opts = {"a": _optimizer("am_adamw", params), "b": _optimizer("adamw_fused", params)}
    clock = PhaseClock(sync=torch.cuda.synchronize)

    def iteration(opt: Any) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            clock.start()
            model.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            fb = clock.lap()
            opt.step()
            return {"fb": fb, "step": clock.lap()}

        return run

    out = timed_rounds(
        {k: iteration(o) for k, o in opts.items()},
        rounds=s.repeat,
        warmup=3,
        max_seconds=s.row_seconds,
    )
    med = statistics.median
    fb = med(out["a"]["fb"] + out["b"]["fb"])
    step_a, step_b = med(out["a"]["step"]), med(out["b"]["step"])
    raw = [
        (fa + sa) / (fb_ + sb)
        for fa, sa, fb_, sb in zip(
            out["a"]["fb"], out["a"]["step"], out["b"]["fb"], out["b"]["step"], strict=True
        )
    ]
    return Measured(
        a=(fb + step_a) * 1e3,
        b=(fb + step_b) * 1e3,
        ratio=(fb + step_a) / (fb + step_b),
        unit="ms",
        note=f"{sum(p.numel() for p in params):,} float32 params, batch {batch} x {seq}, bf16 "
        f"autocast; forward+backward {fb * 1e3:.1f} ms pooled, step {step_a * 1e3:.2f} vs "
        f"{step_b * 1e3:.2f} ms; raw paired iteration ratio {med(raw):.4f}; AM default path: "
        f"{_am_path(torch, params)}; {torch.cuda.get_device_name()}; {len(raw)} pairs",
    )


# --------------------------------------------------------------------------- CuPy: minimize


def _sync_cupy() -> None:
    import cupy

    cupy.cuda.Device().synchronize()


class HandHeavyBall:
    """The heavy-ball loop a user writes in CuPy (or torch), checking f on the host once per
    iteration.

    ``d = g`` at the first step, then ``d = beta d + (1 - beta) g`` and
    ``x = x - lr d`` (the iterates of ``minimize(method="mgd")``); each iteration
    reads ``f`` to the host and stops if it is not finite. ``sync`` waits for the
    device at the end of a run.
    """

    def __init__(
        self,
        value_and_grad: Callable,
        x0: Any,
        lr: float,
        beta: float = 0.9,
        sync: Callable[[], None] = lambda: None,
    ):
        self.vg, self.x0, self.lr, self.beta, self.sync = value_and_grad, x0, lr, beta, sync

    def run(self, iterations: int) -> Any:
        x, d = (self.x0.clone() if hasattr(self.x0, "clone") else self.x0.copy()), None
        for _ in range(iterations):
            f, g = self.vg(x)
            if not math.isfinite(float(f)):
                break
            d = g if d is None else self.beta * d + (1.0 - self.beta) * g
            x = x - self.lr * d
        self.vg(x)  # the objective at the last iterate, which minimize evaluates
        self.sync()
        return x


class HandMiniBatch:
    """The mini-batch heavy-ball loop a user writes in CuPy, reading f once per iteration.

    Each epoch's permutation is drawn on the host by ``numpy.random.default_rng(seed)``
    and moved to the device once (``to_device``); a batch is a slice of it, its rows
    gathered on the device by the problem (``batch_value_and_grad``); ``f`` is read to
    the host once per iteration and the loop stops if it is not finite. ``d = g`` at
    the first step, then ``d = beta d + (1 - beta) g`` and ``x = x - lr d``: the
    iterates of ``minimize(method="msgd")`` with the same seed. ``sync`` waits for the
    device at the end of a run.
    """

    def __init__(
        self,
        problem: Any,
        x0: Any,
        lr: float,
        batch: int,
        to_device: Callable[[np.ndarray], Any],
        beta: float = 0.9,
        seed: int = 0,
        sync: Callable[[], None] = lambda: None,
    ):
        self.problem, self.x0, self.lr, self.batch = problem, x0, lr, batch
        self.to_device, self.beta, self.seed, self.sync = to_device, beta, seed, sync

    def run(self, iterations: int) -> Any:
        rng = np.random.default_rng(self.seed)
        n = self.problem.n_samples
        x, d = self.x0.copy(), None
        perm, pos = None, n
        for _ in range(iterations):
            if pos >= n:  # a new epoch (the last batch of one may be smaller)
                perm, pos = self.to_device(rng.permutation(n)), 0
            f, g = self.problem.batch_value_and_grad(x, perm[pos : pos + self.batch])
            pos += self.batch
            if not math.isfinite(float(f)):
                break
            d = g if d is None else self.beta * d + (1.0 - self.beta) * g
            x = x - self.lr * d
        self.sync()
        return x


def _quad_minimize(method: str, library: str = "cupy") -> Callable[[Settings], Measured]:
    def measure(s: Settings) -> Measured:
        import amopt

        n, k = (10_000, 10) if s.quick else (10_000_000, 50)
        if library == "torch":
            torch = require_cuda()
            h = torch.from_numpy(np.geomspace(1e-3, 1.0, n)).cuda()
            x0 = torch.ones(n, dtype=torch.float64, device="cuda")
            sync, where = torch.cuda.synchronize, f"torch {torch.__version__} CUDA tensors"
            where += f" on {torch.cuda.get_device_name()}"
        else:
            cupy = require_cupy()
            h = cupy.asarray(np.geomspace(1e-3, 1.0, n))
            x0, sync, where = cupy.ones(n), _sync_cupy, _cupy_device(cupy)

        def value_and_grad(x: Any) -> tuple[Any, Any]:
            hx = h * x
            return 0.5 * (hx * x).sum(), hx

        hand = HandHeavyBall(value_and_grad, x0, lr=1.0, sync=sync)

        def ours() -> None:
            res = amopt.minimize(
                value_and_grad, x0, jac=True, method=method, options={"lr": 1.0, "maxiter": k}
            )
            sync()
            if int(res.nit) != k:
                raise RuntimeError(f"minimize({method!r}) stopped after {res.nit} iterations")

        p = interleave(
            ours, lambda: hand.run(k), repeat=s.repeat, warmup=2, max_seconds=s.row_seconds
        )
        return Measured.from_paired(
            p,
            scale=1e3 / k,
            unit="ms/it",
            note=f"n = {n:,} float64, {k} iterations per sample, f returned as a 0-d device "
            f"array; {where}; {len(p.a)} pairs",
        )

    return measure


def _cupy_device(cupy: Any) -> str:
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"]
    return f"CuPy {cupy.__version__} on {name.decode() if isinstance(name, bytes) else name}"


def _libsvm(s: Settings) -> Measured:
    cupy = require_cupy()
    import amopt
    from amopt.problems import LogisticRegression

    path = cases.a9a_path()
    if not path.is_file():
        raise cases.SkipCase(
            f"a9a not found at {path}; pass --data-dir <data> with <data>/libsvm/a9a"
        )
    problem = LogisticRegression.from_libsvm(str(path), n_features=123)
    k = 5 if s.quick else 50
    lr = 1.0 / problem.L
    x_np = np.zeros(problem.dim)
    x_cp = cupy.zeros(problem.dim)

    def run(x0: Any) -> Callable[[], None]:
        def go() -> None:
            amopt.minimize(
                problem.value_and_grad,
                x0,
                jac=True,
                method="am-mgd",
                options={"lr": lr, "maxiter": k, "gtol": 0.0},
            )
            _sync_cupy()

        return go

    p = interleave(run(x_cp), run(x_np), repeat=s.repeat, warmup=2, max_seconds=s.row_seconds)
    return Measured.from_paired(
        p,
        scale=1e3 / k,
        unit="ms/it",
        note=f"a9a ({problem.n_samples} x {problem.n_features}, SciPy sparse), {k} iterations "
        f"per sample from x0 = 0; {_cupy_device(cupy)}; {len(p.a)} pairs",
    )


_DENSE: dict[tuple[int, int, int], tuple[Any, Any, str]] = {}


def _dense_logistic(n: int, d: int, cupy: Any) -> tuple[Any, Any, str]:
    """The dense logistic regression of the am-sgd rows, on the host and on the device
    (built once for both rows)."""
    key = (n, d, id(cupy))
    if key not in _DENSE:
        _DENSE.clear()
        _DENSE[key] = _build_dense_logistic(n, d, cupy)
    return _DENSE[key]


def _build_dense_logistic(n: int, d: int, cupy: Any) -> tuple[Any, Any, str]:
    from amopt.problems import LogisticRegression

    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d))
    y = np.where(X @ rng.standard_normal(d) + rng.standard_normal(n) > 0, 1.0, -1.0)
    on_host = LogisticRegression(X, y)
    try:
        return on_host, LogisticRegression(cupy.asarray(X), y), "design on the device"
    except Exception as exc:  # noqa: BLE001 - the problem may take NumPy data only
        return on_host, on_host, f"design given as NumPy ({type(exc).__name__} with CuPy data)"


class _FullEvaluationsApart:
    """A finite-sum problem whose full evaluations are timed apart from the iterations.

    A mini-batch run of ``minimize`` evaluates the full objective once, at the iterate
    it returns; on the host that pass over all rows can cost more than a hundred
    iterations. ``seconds`` is the time spent in ``value_and_grad`` (the device waited
    for before and after it with ``sync``), so that a row divides only the
    iterations' time by their number.
    """

    def __init__(self, problem: Any, sync: Callable[[], None]) -> None:
        self.problem, self.sync = problem, sync
        self.n_samples = problem.n_samples
        self.seconds = 0.0

    def value_and_grad(self, x: Any) -> tuple[Any, Any]:
        self.sync()
        start = time.perf_counter()
        out = self.problem.value_and_grad(x)
        self.sync()
        self.seconds += time.perf_counter() - start
        return out

    def batch_value_and_grad(self, x: Any, indices: Any) -> tuple[Any, Any]:
        return self.problem.batch_value_and_grad(x, indices)


def _timed_am_sgd(
    problem: Any, x0: Any, sync: Callable[[], None], batch: int, k: int
) -> Callable[[], float]:
    """A call that runs ``k`` iterations of ``minimize(method="am-sgd")`` at ``batch`` and
    returns their seconds, the closing full evaluation timed apart and left out."""
    import amopt

    timed = _FullEvaluationsApart(problem, sync)

    def go() -> float:
        timed.seconds = 0.0
        start = time.perf_counter()
        res = amopt.minimize(
            timed,
            x0,
            method="am-sgd",
            options={"lr": 0.1, "maxiter": k, "batch_size": batch, "seed": 0},
        )
        sync()
        if int(res.nit) != k:
            raise RuntimeError(f"am-sgd stopped after {res.nit} of {k} iterations")
        return time.perf_counter() - start - timed.seconds

    return go


def _am_sgd(batch: int) -> Callable[[Settings], Measured]:
    def measure(s: Settings) -> Measured:
        cupy = require_cupy()
        n, d = (4_000, 50) if s.quick else (200_000, 500)
        k = 10 if s.quick else (100 if batch <= 256 else 20)
        on_host, on_device, built = _dense_logistic(n, d, cupy)

        p = interleave_counted(
            _timed_am_sgd(on_device, cupy.zeros(d), _sync_cupy, batch, k),
            _timed_am_sgd(on_host, np.zeros(d), lambda: None, batch, k),
            repeat=s.repeat,
            max_seconds=s.row_seconds,
        )
        return Measured.from_paired(
            p,
            scale=1e3 / k,
            unit="ms/it",
            note=f"{n:,} x {d} float64 logistic regression, {built}; batch {batch}, {k} "
            "iterations per sample, the full evaluation at the returned iterate timed apart "
            f"and not counted; {_cupy_device(cupy)}; {len(p.a)} pairs",
        )

    return measure


def _am_sgd_hand(s: Settings) -> Measured:
    """``minimize(method="am-sgd")`` at batch 256 against :class:`HandMiniBatch`, both
    on CuPy: what a GPU iteration at that batch costs a careful user's own loop."""
    cupy = require_cupy()
    n, d = (4_000, 50) if s.quick else (200_000, 500)
    batch, k = 256, 10 if s.quick else 100
    _, on_device, built = _dense_logistic(n, d, cupy)
    ours = _timed_am_sgd(on_device, cupy.zeros(d), _sync_cupy, batch, k)
    hand = HandMiniBatch(on_device, cupy.zeros(d), 0.1, batch, cupy.asarray, sync=_sync_cupy)

    def theirs() -> float:
        start = time.perf_counter()
        hand.run(k)
        return time.perf_counter() - start

    p = interleave_counted(ours, theirs, repeat=s.repeat, max_seconds=s.row_seconds)
    return Measured.from_paired(
        p,
        scale=1e3 / k,
        unit="ms/it",
        note=f"{n:,} x {d} float64 logistic regression, {built}; batch {batch}, {k} "
        "iterations per sample; the hand loop: heavy ball, an epoch's permutation moved "
        f"to the device once, f read once per iteration; {_cupy_device(cupy)}; "
        f"{len(p.a)} pairs",
    )


# --------------------------------------------------------------------------- the rows

ROWS: tuple[Row, ...] = (
    Row(
        "gpu-gpt2-bf16-fused",
        "AMAdamW() step / AdamW(fused=True) step, eager, GPT-2 small, bf16 params",
        "AMAdamW()",
        "AdamW(fused=True)",
        1.5,
        _eager("am_adamw", "adamw_fused", "gpt2", "bfloat16"),
    ),
    Row(
        "gpu-gpt2-bf16",
        "AMAdamW() step / AdamW() step (torch's default), eager, GPT-2 small, bf16 params",
        "AMAdamW()",
        "AdamW()",
        1.0,
        _eager("am_adamw", "adamw", "gpt2", "bfloat16"),
    ),
    Row(
        "gpu-gpt2-fp32-fused",
        "AMAdamW() step / AdamW(fused=True) step, eager, GPT-2 small, fp32 params",
        "AMAdamW()",
        "AdamW(fused=True)",
        None,
        _eager("am_adamw", "adamw_fused", "gpt2", "float32"),
    ),
    Row(
        "gpu-gpt2-fp32",
        "AMAdamW() step / AdamW() step (torch's default), eager, GPT-2 small, fp32 params",
        "AMAdamW()",
        "AdamW()",
        1.0,
        _eager("am_adamw", "adamw", "gpt2", "float32"),
    ),
    Row(
        "gpu-host-adamw",
        "host time of AMAdamW().step / AdamW(fused=True).step, GPT-2 small (148 tensors), bf16",
        "AMAdamW()",
        "AdamW(fused=True)",
        1.5,
        _host("am_adamw", "adamw_fused", "gpt2"),
    ),
    Row(
        "gpu-host-adamw-1480",
        "host time of AMAdamW().step / AdamW(fused=True).step, GPT-2 small's params in 1480 "
        "tensors, bf16",
        "AMAdamW()",
        "AdamW(fused=True)",
        1.5,
        _host("am_adamw", "adamw_fused", "gpt2-1480"),
    ),
    Row(
        "gpu-host-amsgd",
        "host time of AMSGD().step / AdamW(fused=True).step, GPT-2 small (148 tensors), bf16",
        "AMSGD()",
        "AdamW(fused=True)",
        1.5,
        _host("amsgd", "adamw_fused", "gpt2"),
    ),
    Row(
        "gpu-host-amsgd-1480",
        "host time of AMSGD().step / AdamW(fused=True).step, GPT-2 small's params in 1480 "
        "tensors, bf16",
        "AMSGD()",
        "AdamW(fused=True)",
        1.5,
        _host("amsgd", "adamw_fused", "gpt2-1480"),
    ),
    Row(
        "gpu-amsgd",
        "AMSGD() step / SGD(momentum=0.9) step, eager, GPT-2 small, bf16",
        "AMSGD()",
        "SGD(momentum=0.9)",
        1.3,
        _eager("amsgd", "sgd", "gpt2", "bfloat16"),
    ),
    Row(
        "gpu-foreach",
        "AMAdamW(foreach=True) step / AdamW(foreach=True) step, eager, GPT-2 small, bf16",
        "AMAdamW(foreach=True)",
        "AdamW(foreach=True)",
        None,
        _eager("am_adamw_foreach", "adamw_foreach", "gpt2", "bfloat16"),
    ),
    Row(
        "gpu-1b-bf16",
        "AMAdamW() step / AdamW(fused=True) step, eager, 1.24B bf16 params (Llama-3.2-1B)",
        "AMAdamW()",
        "AdamW(fused=True)",
        1.3,
        _eager("am_adamw", "adamw_fused", "1b", "bfloat16"),
    ),
    Row(
        "gpu-gpt2-train",
        "GPT2LMHeadModel training iteration (batch 8 x 1024, bf16 autocast), AMAdamW() / "
        "AdamW(fused=True) (overhead <= 0.5%)",
        "AMAdamW()",
        "AdamW(fused=True)",
        1.005,
        _gpt2_train,
    ),
    Row(
        "gpu-quad-mgd",
        "minimize(method='mgd') per iteration / hand-written CuPy heavy-ball loop reading f "
        "once per iteration, 10^7 float64 quadratic",
        "minimize mgd",
        "hand CuPy loop",
        1.1,
        _quad_minimize("mgd"),
    ),
    Row(
        "gpu-quad-am-mgd",
        "minimize(method='am-mgd') per iteration / hand-written CuPy heavy-ball loop reading "
        "f once per iteration, 10^7 float64 quadratic",
        "minimize am-mgd",
        "hand CuPy loop",
        1.3,
        _quad_minimize("am-mgd"),
    ),
    Row(
        "gpu-quad-am-mgd-torch",
        "minimize(method='am-mgd') per iteration / hand-written heavy-ball loop reading f once "
        "per iteration, both on torch CUDA tensors, 10^7 float64 quadratic",
        "minimize am-mgd",
        "hand torch loop",
        None,
        _quad_minimize("am-mgd", "torch"),
    ),
    Row(
        "gpu-libsvm",
        "minimize(method='am-mgd') per iteration, a9a logistic regression (sparse), CuPy x0 / "
        "NumPy x0",
        "CuPy",
        "NumPy",
        1.0,
        _libsvm,
    ),
    Row(
        "gpu-am-sgd-256",
        "minimize(method='am-sgd') per iteration, batch 256, dense 200,000 x 500 logistic "
        "regression, CuPy / NumPy",
        "CuPy",
        "NumPy",
        1.0,
        _am_sgd(256),
    ),
    Row(
        "gpu-am-sgd-4096",
        "minimize(method='am-sgd') per iteration, batch 4096, dense 200,000 x 500 logistic "
        "regression, CuPy / NumPy",
        "CuPy",
        "NumPy",
        1.0,
        _am_sgd(4096),
    ),
    Row(
        "gpu-am-sgd-256-hand",
        "minimize(method='am-sgd') per iteration, batch 256, dense 200,000 x 500 logistic "
        "regression, CuPy / a hand-written CuPy mini-batch heavy-ball loop",
        "minimize am-sgd",
        "hand CuPy loop",
        None,
        _am_sgd_hand,
    ),
    Row(
        "gpu-graph",
        "CUDA-graph replay of AMAdamW(capturable=True).step / of AdamW(fused=True, "
        "capturable=True).step, GPT-2 small, bf16",
        "AMAdamW(capturable=True)",
        "AdamW(fused, capturable)",
        1.3,
        _eager("am_adamw_capturable", "adamw_fused_capturable", "gpt2", "bfloat16"),
    ),
    Row(
        "gpu-fsdp2",
        "optimizer step on FSDP2 parameters (fully_shard per block, world size 1, NCCL), "
        "AMAdamW() / AdamW(fused=True), GPT-2 small shapes, fp32",
        "AMAdamW()",
        "AdamW(fused=True)",
        1.5,
        _in_child("fsdp2"),
    ),
    Row(
        "gpu-compiled",
        "torch.compile(AMAdamW().step) / torch.compile(AdamW().step), GPT-2 small's "
        "embeddings and first 4 blocks (52 tensors), bf16",
        "AMAdamW() compiled",
        "AdamW() compiled",
        1.5,
        _in_child("compiled"),
    ),
)


# --------------------------------------------------------------------------- earlier rows


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

        from amopt.core.config import AMConfig
        from amopt.torch._records import AdamHyper, AdamTensors
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
        shapes = layouts.shrunk_shapes(shapes_of()) if settings.quick else shapes_of()
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
