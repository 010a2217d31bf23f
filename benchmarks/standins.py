"""CPU rows that stand in for the GPU targets, run everywhere.

* ``triton-host-*``: the host time of a step of ``AMAdamW()`` / ``AMSGD()`` on the
  Triton driver with its launches stubbed (:class:`benchmarks.host.TritonHostCase`),
  at the GPT-2-small layout (148 tensors; target 0.5 ms) and with the same
  parameters in 1480 tensors (target 3x that budget, 1.5 ms; the time over the
  148-tensor one, measured side by side, in the row's note: what a tensor adds);
  ``triton-host-adamw-compiled`` and ``-sharded`` (informational) the compiled step's
  against the eager one's, and a step of FSDP2-sharded ``DTensor``s against plain tensors;
* ``foreach-ops*``: aten operations of one ``AMAdamW(foreach=True)`` step, run as on
  a GPU (the device strategy, forced on the CPU), against ``1.5 x`` those of
  ``torch.optim.AdamW(foreach=True)`` ``+ 40``; views are not counted (on a GPU every
  other operation is a kernel launch, a view none);
* ``minimize-syncs`` / ``minimize-ops``: host synchronisations per iteration of
  ``amopt.minimize`` on torch tensors, the worst method against 1, and am-mgd's aten
  operations per iteration against mgd's + 12; ``minimize-ops-pipelined``
  (informational): the same in the pipelined loop of CUDA and CuPy, forced on the
  CPU, whose AM rule runs on the device (asynchronous launches there, not host waits);
* ``minimize-bytes-*``: the bytes that the aten operations of an iteration of
  ``minimize(method="mgd" / "am-mgd")`` read and write (:class:`Traffic`), on a
  float64 torch quadratic, against those of the hand-written heavy-ball loop of the
  ``gpu-quad-*`` rows (:class:`benchmarks.gpu.HandHeavyBall`) on the same tensors:
  on a large array a GPU iteration costs its memory traffic;
* ``minimize-host-*`` (informational): the time per iteration of ``minimize`` on tiny
  torch problems, where the arrays cost nothing, against hand-written loops that read f
  once per iteration (heavy ball, full batch; for ``am-sgd`` a mini-batch heavy-ball loop
  drawing its batches per epoch on the device): the host work a GPU iteration waits
  for, which decides the small-batch GPU rows.

A count or a budget is the baseline of these rows; their metric says how the ratio
is formed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from amopt.bench._records import Measured, Row, Settings
from amopt.bench._timing import Paired, interleave, interleave_counted, timed_rounds
from benchmarks import cases as layouts
from benchmarks import host as _host

__all__ = ["EXTRA_ROWS", "HOST_BUDGET_MS", "ROWS", "layout", "minimize_traffic"]

#: the driver's host time per step allowed at the GPT-2-small layout, ms
HOST_BUDGET_MS = 0.5
#: untimed steps before a host-time row's timed ones: the steady state of a training run
#: (Python 3.11 specialises a function's bytecode after a few calls; the first ~8 steps of
#: a driver take up to 3x longer on the host)
HOST_WARMUP = 10
#: tensors of the large layout: GPT-2 small's parameters, each in ten pieces
MANY = 10
#: the host time allowed at ``MANY`` times the tensors, in budgets of the GPT-2-small layout
SCALING = 3.0


def layout(n_tensors: int, quick: bool = False) -> list[tuple[int, ...]]:
    """GPT-2 small's parameter shapes (148 tensors), or the same parameters in 1480.

    Examples
    --------
    >>> len(layout(148)), len(layout(1480))
    (148, 1480)
    """
    shapes = layouts.gpt2_small_shapes()
    if quick:
        shapes = layouts.shrunk_shapes(shapes)
    if n_tensors == len(shapes):
        return shapes
    if n_tensors == MANY * len(shapes):
        return layouts.many_tensor_shapes(shapes, MANY)
    raise ValueError(f"n_tensors must be {len(shapes)} or {MANY * len(shapes)}; got {n_tensors}")


def _quartiles(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    if len(xs) < 4:
        return xs[0], xs[-1]
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def _over_budget(seconds: list[float], budget_ms: float, note: str) -> Measured:
    """Timed steps (in seconds) against a budget in ms: their median over it, with the
    quartiles' ratios as the spread."""
    ms = [t * 1e3 for t in seconds]
    q1, q3 = _quartiles(ms)
    median = statistics.median(ms)
    return Measured(
        a=median,
        b=budget_ms,
        ratio=median / budget_ms,
        unit="ms",
        spread=(q1 / budget_ms, q3 / budget_ms),
        note=note,
    )


def _host_time(optimizer: str) -> Callable[[Settings], Measured]:
    def measure(s: Settings) -> Measured:
        case = _host.TritonHostCase(optimizer, layout(148, s.quick))
        out = timed_rounds(
            {"a": case.run}, rounds=s.repeat, warmup=HOST_WARMUP, max_seconds=s.row_seconds
        )["a"]["total"]
        launches = sum(case.launches.values()) / (len(out) + HOST_WARMUP + 1)
        return _over_budget(
            out,
            HOST_BUDGET_MS,
            f"{case.n_tensors} tensors (GPT-2 small), launches stubbed, "
            f"{launches:.0f} launch(es) per step, after {HOST_WARMUP} untimed steps",
        )

    return measure


def _host_pair(
    a: _host.TritonHostCase, b: _host.TritonHostCase, s: Settings, note: Callable[[int], str]
) -> Measured:
    """Steps of ``a`` against steps of ``b``, interleaved, in ms; ``note`` gets the number of
    steps each case has run (the warm-up and the case's own first step included)."""
    p: Paired = interleave(
        a.run, b.run, repeat=s.repeat, warmup=HOST_WARMUP, max_seconds=s.row_seconds
    )
    return Measured.from_paired(p, scale=1e3, unit="ms", note=note(len(p.a) + HOST_WARMUP + 1))


def _host_scaling(optimizer: str) -> Callable[[Settings], Measured]:
    """The step at 1480 tensors against ``MANY`` times the 148-tensor budget, with the
    1480-tensor step timed against the same parameters in 148 tensors (in the note)."""

    def measure(s: Settings) -> Measured:
        big = _host.TritonHostCase(optimizer, layout(MANY * 148, s.quick))
        small = _host.TritonHostCase(optimizer, layout(148, s.quick))
        p: Paired = interleave(
            big.run, small.run, repeat=s.repeat, warmup=HOST_WARMUP, max_seconds=s.row_seconds
        )
        steps = len(p.a) + HOST_WARMUP + 1
        s1, s3 = p.spread()
        return _over_budget(
            p.a,
            SCALING * HOST_BUDGET_MS,
            f"{big.n_tensors} tensors / {small.n_tensors} (the same parameters, "
            f"interleaved): {p.median_ratio:.2f} (IQR {s1:.2f}-{s3:.2f}), "
            f"{p.median_b * 1e3:.3f} ms at {small.n_tensors}; launches per step "
            f"{sum(big.launches.values()) / steps:.0f} at {big.n_tensors} tensors, "
            f"{sum(small.launches.values()) / steps:.0f} at {small.n_tensors}",
        )

    return measure


def _host_compiled(optimizer: str) -> Callable[[Settings], Measured]:
    def measure(s: Settings) -> Measured:
        compiled = _host.TritonHostCase(optimizer, layout(148, s.quick), compiled=True)
        eager = _host.TritonHostCase(optimizer, layout(148, s.quick))
        return _host_pair(
            compiled,
            eager,
            s,
            lambda steps: (
                f"{compiled.n_tensors} tensors (GPT-2 small), launches stubbed; "
                f"{sum(compiled.launches.values()) / steps:.0f} launch(es) per compiled step; "
                "the compiled step runs the driver inside its operator, without the "
                "optimizer's plan"
            ),
        )

    return measure


def _host_sharded(optimizer: str) -> Callable[[Settings], Measured]:
    def measure(s: Settings) -> Measured:
        shapes = layout(148, s.quick)
        with _host.one_rank_mesh() as mesh:
            sharded = _host.TritonHostCase(optimizer, shapes, mesh=mesh, new_grads=True)
            plain = _host.TritonHostCase(optimizer, shapes, new_grads=True)

            def step(case: _host.TritonHostCase) -> Callable[[], float]:
                def run() -> float:
                    case.new_gradients()  # not timed
                    start = time.perf_counter()
                    case.run()
                    return time.perf_counter() - start

                return run

            p: Paired = interleave_counted(
                step(sharded), step(plain), repeat=s.repeat, max_seconds=s.row_seconds
            )
        return Measured.from_paired(
            p,
            scale=1e3,
            unit="ms",
            note=f"{sharded.n_tensors} tensors (GPT-2 small) as DTensors sharded on dim 0 "
            "over a one-rank gloo mesh (FSDP2's layout) against plain tensors; new "
            "gradients at every step on both sides; launches stubbed",
        )

    return measure


def _foreach_ops(kind_a: str, kind_b: str, n_tensors: int) -> Callable[[Settings], Measured]:
    """The AM side as a GPU runs it (the device strategy, where amopt can force it on the
    CPU); the CPU strategy's count in the note."""

    def measure(s: Settings) -> Measured:
        shapes = layout(n_tensors, s.quick)
        a = _host.foreach_step_ops(kind_a, shapes, as_on_gpu=True)
        b = _host.foreach_step_ops(kind_b, shapes)
        cpu = _host.foreach_step_ops(kind_a, shapes) if a.as_on_gpu else a
        allowed = 1.5 * b.kernel_ops + 40
        top = ", ".join(f"{name.split('.')[1]} {n}" for name, n in a.ops.most_common(4))
        strategy = (
            f"AM side in the device strategy (as on a GPU); the CPU strategy (cache-sized "
            f"chunks): {cpu.kernel_ops} ops"
            if a.as_on_gpu
            else "AM side in the CPU strategy (this version cannot run the device one on the CPU)"
        )
        return Measured(
            a=a.kernel_ops,
            b=b.kernel_ops,
            ratio=a.kernel_ops / allowed,
            unit="ops",
            note=f"{n_tensors} tensors (GPT-2 small layout, float32); allowed 1.5 x "
            f"{b.kernel_ops} + 40 = {allowed:.0f}; {strategy}; views (no kernel) not "
            f"counted: {a.views} on the AM side, {b.views} on torch's; most frequent on the "
            f"AM side: {top}; values read to Python per step {a.syncs} vs {b.syncs} (CPU "
            "step counters' item() included, which are no synchronisation on a GPU)",
        )

    return measure


def _minimize_syncs(s: Settings) -> Measured:
    n = 200 if s.quick else 1000
    per: dict[str, float] = {}
    for method in _host.FULL_BATCH_METHODS:
        per[method] = _host.minimize_counts(method, n=n)["syncs"]
    for method in _host.MINI_BATCH_METHODS:
        per[f"{method} (batch)"] = _host.minimize_counts(method, batch=True, n=n)["syncs"]
    worst = max(per, key=per.__getitem__)
    return Measured(
        a=per[worst],
        b=1.0,
        ratio=per[worst],
        unit="syncs/it",
        note=f"worst: {worst}; per iteration: " + ", ".join(f"{k} {v:g}" for k, v in per.items()),
    )


def _minimize_ops(
    method_a: str, method_b: str, slack: int, pipelined: bool = False
) -> Callable[[Settings], Measured]:
    def measure(s: Settings) -> Measured:
        n = 200 if s.quick else 1000
        a = _host.minimize_counts(method_a, n=n, pipelined=pipelined)
        b = _host.minimize_counts(method_b, n=n, pipelined=pipelined)
        how = (
            "the pipelined loop of a CUDA device or CuPy (forced), whose AM rule runs on "
            "0-d device arrays; "
            if pipelined
            else ""
        )
        return Measured(
            a=a["ops"],
            b=b["ops"],
            ratio=a["ops"] / (b["ops"] + slack),
            unit="ops/it",
            note=f"float64 torch CPU tensors, {how}quadratic of dimension {n}, objective's "
            f"ops included on both sides; allowed {b['ops']:g} + {slack}; host syncs per "
            f"iteration {a['syncs']:g} vs {b['syncs']:g}",
        )

    return measure


def _hand_heavy_ball(value_and_grad: Callable, x0: Any, lr: float, beta: float, k: int) -> Any:
    """:meth:`benchmarks.gpu.HandHeavyBall.run` on torch tensors: the same operations."""
    import math

    x, d = x0.clone(), None
    for _ in range(k):
        f, g = value_and_grad(x)
        if not math.isfinite(float(f)):
            break
        d = g if d is None else beta * d + (1.0 - beta) * g
        x = x - lr * d
    value_and_grad(x)  # the objective at the last iterate, which minimize evaluates
    return x


def minimize_traffic(
    method: str | None, n: int, iterations: tuple[int, int] = (4, 12), **options: Any
) -> dict[str, float]:
    """Per iteration: bytes, full-size operations and all operations of a run.

    ``method`` None runs the hand-written heavy-ball loop of the ``gpu-quad-*`` rows
    (the operations of :class:`benchmarks.gpu.HandHeavyBall`), else
    ``amopt.minimize(method=...)`` with ``lr=1`` and ``options``, on the float64 torch quadratic of
    :func:`benchmarks.host.minimize_counts` (dimension ``n``, ``x0`` ones). The
    figures are the differences between the runs of the two iteration counts over
    their difference (the start and the end of a run cancel). ``bytes`` is divided
    by ``8 n``: in passes over one array.
    """
    import amopt
    from benchmarks.counters import Traffic

    fun, x0 = _host._quadratic(n)
    runs = []
    for k in iterations:
        with Traffic(full=n) as t:
            if method is None:
                _hand_heavy_ball(fun, x0, 1.0, 0.9, k)
            else:
                opts = {"lr": 1.0, **options, "maxiter": k}
                res = amopt.minimize(fun, x0, jac=True, method=method, options=opts)
                if int(res.nit) != k:
                    raise RuntimeError(f"minimize({method!r}) stopped after {res.nit} of {k}")
        runs.append(t)
    a, b = runs
    steps = iterations[1] - iterations[0]
    return {
        "bytes": (b.bytes - a.bytes) / steps / (8 * n),
        "full_ops": (b.full_ops - a.full_ops) / steps,
        "ops": (b.total_ops - a.total_ops) / steps,
    }


def _minimize_bytes(method: str) -> Callable[[Settings], Measured]:
    def measure(s: Settings) -> Measured:
        n = 10_000 if s.quick else 1_000_000
        a = minimize_traffic(method, n)
        b = minimize_traffic(None, n)
        return Measured(
            a=a["bytes"],
            b=b["bytes"],
            ratio=a["bytes"] / b["bytes"],
            unit="passes/it",
            note=f"float64 torch CPU tensors, quadratic of dimension {n:,}, gtol 1e-5 (the "
            f"default); bytes read and written per iteration in passes over one array (8 n "
            f"bytes); full-size ops per iteration {a['full_ops']:g} vs {b['full_ops']:g}, "
            f"all ops {a['ops']:g} vs {b['ops']:g}",
        )

    return measure


#: dimension of the quadratic, rows and features of the logistic regression and batch
#: size of the ``minimize-host-*`` rows: arrays so small that an iteration costs its
#: host work (what a GPU waits for between launches), not its arithmetic
HOST_QUADRATIC_DIM = 16
HOST_LOGISTIC = (4096, 16, 256)


def _hand_mini_batch(problem: Any, x0: Any, lr: float, beta: float, k: int, batch: int) -> Any:
    """The mini-batch heavy-ball loop a user writes on device arrays.

    Each epoch's permutation is drawn on the host and moved to the device once; a
    batch is a slice of it, its rows gathered on the device by the problem
    (``batch_value_and_grad``); ``f`` is read to the host once per iteration and the
    loop stops if it is not finite. ``d = g`` at the first step, then
    ``d = beta d + (1 - beta) g`` and ``x = x - lr d``.
    """
    import math

    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    n = problem.n_samples
    x, d = x0.clone(), None
    perm, pos = None, n
    for _ in range(k):
        if pos >= n:
            perm, pos = torch.from_numpy(rng.permutation(n)).to(x.device), 0
        f, g = problem.batch_value_and_grad(x, perm[pos : pos + batch])
        pos += batch
        if not math.isfinite(float(f)):
            break
        d = g if d is None else beta * d + (1.0 - beta) * g
        x = x - lr * d
    problem.value_and_grad(x)  # the full objective at the last iterate, as minimize
    return x


def host_time_setup(
    method: str | None, batch: bool, quick: bool = False
) -> tuple[Callable[[int], Any], int]:
    """``(run, k)``: ``run(k)`` runs ``k`` iterations of ``minimize(method=...)`` (or,
    ``method`` None, the hand-written loop) on the tiny torch problem of the
    ``minimize-host-*`` rows; ``k`` is the iteration count the rows time (fewer with
    ``quick``)."""
    import numpy as np
    import torch

    import amopt

    if batch:
        from amopt.problems import LogisticRegression

        n, dim, size = HOST_LOGISTIC
        rng = np.random.default_rng(0)
        X = rng.standard_normal((n, dim))
        # noisy labels and a small l2: bounded iterates (no underflowing exp to slow a side)
        y = np.where(X @ rng.standard_normal(dim) + rng.standard_normal(n) > 0, 1.0, -1.0)
        problem: Any = LogisticRegression(torch.from_numpy(X), y, l2=1e-3)
        x0 = torch.zeros(dim, dtype=torch.float64)
        options: dict[str, Any] = {"lr": 0.1, "batch_size": size, "seed": 0}
        jac = None
    else:
        problem, x0 = _host._quadratic(HOST_QUADRATIC_DIM)
        options, jac = {"lr": 0.5}, True

    def run(k: int) -> Any:
        if method is None:
            if batch:
                return _hand_mini_batch(problem, x0, options["lr"], 0.9, k, options["batch_size"])
            return _hand_heavy_ball(problem, x0, options["lr"], 0.9, k)
        res = amopt.minimize(
            problem, x0, jac=jac, method=method, options={**options, "maxiter": k}
        )
        if int(res.nit) != k:
            raise RuntimeError(f"minimize({method!r}) stopped after {res.nit} of {k} iterations")
        return res

    return run, 30 if quick else 300


def _minimize_host(method: str, batch: bool) -> Callable[[Settings], Measured]:
    def measure(s: Settings) -> Measured:
        import torch

        s.apply_threads()
        run_a, k = host_time_setup(method, batch, s.quick)
        run_b, _ = host_time_setup(None, batch, s.quick)
        p = interleave(
            lambda: run_a(k), lambda: run_b(k), repeat=s.repeat, max_seconds=s.row_seconds
        )
        if batch:
            n, dim, size = HOST_LOGISTIC
            what = f"dense logistic regression {n} x {dim} on torch, batch {size}"
        else:
            what = f"float64 torch quadratic of dimension {HOST_QUADRATIC_DIM}"
        return Measured.from_paired(
            p,
            scale=1e6 / k,
            unit="us/it",
            note=f"{what}, CPU tensors, {torch.get_num_threads()} torch thread(s); {k} "
            "iterations per run (minimize's set-up and closing evaluation included, the "
            f"hand loop's closing evaluation too); {len(p.a)} pairs",
        )

    return measure


ROWS: tuple[Row, ...] = (
    Row(
        "triton-host-adamw",
        f"host time of an AMAdamW() step on the Triton driver, launches stubbed, GPT-2 small "
        f"layout (148 tensors) / a {HOST_BUDGET_MS:g} ms budget",
        "AMAdamW() driver",
        "budget",
        1.0,
        _host_time("am_adamw"),
    ),
    Row(
        "triton-host-adamw-1480",
        f"host time of an AMAdamW() step on the Triton driver, launches stubbed, the same "
        f"parameters in 1480 tensors / {SCALING:g}x the {HOST_BUDGET_MS:g} ms budget of 148 "
        "(the time over that at 148 tensors, side by side, in the note)",
        "1480 tensors",
        "budget",
        1.0,
        _host_scaling("am_adamw"),
    ),
    Row(
        "triton-host-amsgd",
        f"host time of an AMSGD() step on the Triton driver, launches stubbed, GPT-2 small "
        f"layout (148 tensors) / a {HOST_BUDGET_MS:g} ms budget",
        "AMSGD() driver",
        "budget",
        1.0,
        _host_time("amsgd"),
    ),
    Row(
        "triton-host-amsgd-1480",
        f"host time of an AMSGD() step on the Triton driver, launches stubbed, the same "
        f"parameters in 1480 tensors / {SCALING:g}x the {HOST_BUDGET_MS:g} ms budget of 148 "
        "(the time over that at 148 tensors, side by side, in the note)",
        "1480 tensors",
        "budget",
        1.0,
        _host_scaling("amsgd"),
    ),
    Row(
        "triton-host-adamw-compiled",
        "host time of a compiled AMAdamW() step (torch.compile(step, fullgraph=True)) on the "
        "Triton driver, launches stubbed, 148 tensors / the eager step's",
        "compiled",
        "eager",
        None,
        _host_compiled("am_adamw"),
    ),
    Row(
        "triton-host-adamw-sharded",
        "host time of an AMAdamW() step on the Triton driver, launches stubbed, 148 "
        "DTensors (Shard(0), one rank) / the same on plain tensors, new gradients each step",
        "DTensor",
        "plain",
        None,
        _host_sharded("am_adamw"),
    ),
    Row(
        "foreach-ops",
        "aten ops (views excluded) of an AMAdamW(foreach=True) step / (1.5 x "
        "AdamW(foreach=True)'s + 40), GPT-2 small layout (148 tensors)",
        "AMAdamW(foreach=True)",
        "AdamW(foreach=True)",
        1.0,
        _foreach_ops("am_adamw_foreach", "adamw_foreach", 148),
    ),
    Row(
        "foreach-ops-1480",
        "aten ops (views excluded) of an AMAdamW(foreach=True) step / (1.5 x "
        "AdamW(foreach=True)'s + 40), GPT-2 small's parameters in 1480 tensors",
        "AMAdamW(foreach=True)",
        "AdamW(foreach=True)",
        1.0,
        _foreach_ops("am_adamw_foreach", "adamw_foreach", MANY * 148),
    ),
    Row(
        "minimize-syncs",
        "host synchronisations per iteration of minimize on torch tensors, the worst method "
        "(full batch and mini-batch) / 1",
        "worst method",
        "one per iteration",
        1.0,
        _minimize_syncs,
    ),
    Row(
        "minimize-ops",
        "aten ops per iteration of minimize on torch tensors, am-mgd / (mgd + 12)",
        "am-mgd",
        "mgd",
        1.0,
        _minimize_ops("am-mgd", "mgd", 12),
    ),
    Row(
        "minimize-bytes-mgd",
        "bytes per iteration of minimize(method='mgd') / of the hand-written heavy-ball loop "
        "reading f once per iteration, float64 torch quadratic",
        "minimize mgd",
        "hand loop",
        1.1,
        _minimize_bytes("mgd"),
    ),
    Row(
        "minimize-bytes-am-mgd",
        "bytes per iteration of minimize(method='am-mgd') / of the hand-written heavy-ball "
        "loop reading f once per iteration, float64 torch quadratic",
        "minimize am-mgd",
        "hand loop",
        1.3,
        _minimize_bytes("am-mgd"),
    ),
    Row(
        "minimize-host-mgd",
        "host time per iteration of minimize(method='mgd') / of the hand-written heavy-ball "
        "loop reading f once per iteration, tiny torch quadratic (stands in for gpu-quad-mgd)",
        "minimize mgd",
        "hand loop",
        None,
        _minimize_host("mgd", False),
    ),
    Row(
        "minimize-host-am-mgd",
        "host time per iteration of minimize(method='am-mgd') / of the hand-written "
        "heavy-ball loop reading f once per iteration, tiny torch quadratic (stands in for "
        "gpu-quad-am-mgd)",
        "minimize am-mgd",
        "hand loop",
        None,
        _minimize_host("am-mgd", False),
    ),
    Row(
        "minimize-host-am-sgd",
        "host time per iteration of minimize(method='am-sgd') / of a hand-written "
        "mini-batch heavy-ball loop (batches drawn per epoch on the device, f read once "
        "per iteration), tiny torch logistic regression, batch 256 (stands in for "
        "gpu-am-sgd-256)",
        "minimize am-sgd",
        "hand loop",
        None,
        _minimize_host("am-sgd", True),
    ),
)

#: informational rows, run with ``--extra``
EXTRA_ROWS: tuple[Row, ...] = (
    Row(
        "minimize-ops-pipelined",
        "aten ops per pipelined iteration of minimize (the device loop of CUDA and CuPy), "
        "am-mgd / (mgd + 12)",
        "am-mgd",
        "mgd",
        None,
        _minimize_ops("am-mgd", "mgd", 12, pipelined=True),
    ),
    Row(
        "foreach-ops-amsgd",
        "aten ops (views excluded) of an AMSGD(foreach=True) step / (1.5 x SGD(momentum=0.9, "
        "dampening=0.9, foreach=True)'s + 40), GPT-2 small layout (148 tensors)",
        "AMSGD(foreach=True)",
        "SGD(foreach=True)",
        None,
        _foreach_ops("amsgd_foreach", "sgd_foreach", 148),
    ),
    Row(
        "minimize-ops-adamw",
        "aten ops per iteration of minimize on torch tensors, am-adamw / (adamw + 12)",
        "am-adamw",
        "adamw",
        None,
        _minimize_ops("am-adamw", "adamw", 12),
    ),
)
