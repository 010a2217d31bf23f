"""Structure of the foreach steps: operators per step, and the device strategy.

The foreach implementations of AMSGD and AMAdamW run whole-tensor multi-tensor ops
(``torch._foreach_*``); their sums are multi-tensor sums of squares, so that no
operator runs once per tensor. Counted with the shared op counter
(:class:`benchmarks.counters.OpCounter`, a ``TorchDispatchMode``):

* on the CPU, a step over a GPT-2-small layout of 148 tensors and over 1480 tensors
  (the same layout ten times, each tensor ten times smaller) runs at most
  ``1.5 x + 40`` the operators of torch's own foreach step (AdamW's, SGD's with
  momentum), and the same number of them at both tensor counts. (Buckets larger than
  one cache-sized chunk, :data:`amopt.torch._common.CPU_CHUNK` per thread, run chunk by
  chunk: there the count grows with the number of chunks, not of tensors.)
* the device strategy (``foreach_mode == "flat"``, what CUDA and every other device run,
  forced here on the CPU with :data:`amopt.torch._common.FORCE_DEVICE_STRATEGY`) runs a
  number of multi-tensor ops and of other kernels that does not depend on the tensor
  count: the per-tensor operators it runs are 1-D views (metadata, no kernel launch).
  Its iterates are those of the single-tensor reference, and its betas are
  scale-invariant as the reference's.

On a CUDA device the kernels launched per step are counted with ``torch.profiler``.
"""

from __future__ import annotations

import collections
from typing import NamedTuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import test_torch_beta_scale as beta_scale  # noqa: E402
import test_torch_optim as optim_tests  # noqa: E402
from torch_optim_info import N_STEPS, case_id, run_torch  # noqa: E402

import amopt.torch._common as common  # noqa: E402
from amopt.torch import AMSGD, AMAdam, AMAdamW  # noqa: E402
from benchmarks.counters import OpCounter  # noqa: E402


def _fast_route(args, same_dtype: bool) -> bool:
    """Whether a multi-tensor op's tensor lists qualify for the device's one-launch route.

    CUDA's ``_foreach_*`` kernels launch once for a whole list only when the tensors at
    each position of every list have one shape, strides, dtype and device (a 0-d tensor
    beside a matrix, as a per-tensor scalar, takes one launch per tensor); a single
    tensor operand (a 0-d scalar for every tensor) is allowed. ``_foreach_copy_`` may
    convert dtypes.
    """
    lists = [a for a in args if isinstance(a, (list, tuple)) and a and torch.is_tensor(a[0])]
    first = lists[0]
    for other in lists[1:]:
        for a, b in zip(first, other, strict=True):
            if a.shape != b.shape or a.stride() != b.stride() or a.device != b.device:
                return False
            if same_dtype and a.dtype != b.dtype:
                return False
    return all(t.is_contiguous() for ts in lists for t in ts)


def _gpt2_layout(d: int = 48, vocab: int = 3141, positions: int = 64) -> list[tuple[int, ...]]:
    """GPT-2 small's 148 parameter shapes with every dimension divided by 16."""
    shapes: list[tuple[int, ...]] = [(vocab, d), (positions, d)]
    for _ in range(12):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,)]
        shapes += [(d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return shapes + [(d,), (d,)]


def _layout(n_tensors: int) -> list[tuple[int, ...]]:
    """148 tensors, or the layout 10 times with each tensor's first dimension / 10."""
    shapes = _gpt2_layout()
    if n_tensors == 148:
        return shapes
    assert n_tensors == 1480
    return [(max(1, s[0] // 10), *s[1:]) for s in shapes] * 10


def _ops_per_step(make, shapes, dtype=torch.float32, n_warm=2):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in shapes]
    for p in params:
        p.grad = (1e-2 * torch.randn(p.shape, generator=gen)).to(dtype)
    opt = make(params)
    for _ in range(n_warm):  # the first step creates the state
        opt.step()
    slow = []  # the multi-tensor ops whose lists miss the device's one-launch route

    def route(func, args, kwargs, out):
        name = func.overloadpacket.__name__
        if name.startswith("_foreach") and not _fast_route(
            args, same_dtype=name != "_foreach_copy_"
        ):
            slow.append(name)

    with OpCounter(route) as ops:
        opt.step()
    return _Ops(_kinds(ops), ops.packets(), slow, ops.total_ops)


class _Ops(NamedTuple):
    """A step's operators: ``_foreach_*``, views and the others; by name; the slow ones."""

    kinds: collections.Counter[str]
    names: collections.Counter[str]
    slow: list[str]
    total: int


def _kinds(ops: OpCounter) -> collections.Counter[str]:
    return collections.Counter(
        "foreach"
        if f.overloadpacket.__name__.startswith("_foreach")
        else "view"
        if f.is_view
        else "other"
        for f in ops.calls
    )


AM_ADAMW_KINDS = {
    "per-layer": lambda ps: AMAdamW(ps, foreach=True),
    "global": lambda ps: AMAdamW(ps, foreach=True, per_layer=False),
    "proximal-lam0": lambda ps: AMAdamW(ps, foreach=True, weight_decay_mode="proximal", lam=0.0),
    "AMAdam-l2": lambda ps: AMAdam(ps, foreach=True, weight_decay=1e-2),
}
AMSGD_KINDS = {
    "global": lambda ps: AMSGD(ps, lr=1e-3, foreach=True),
    "per-layer-wd-max": lambda ps: AMSGD(
        ps, lr=1e-3, foreach=True, per_layer=True, weight_decay=1e-3, maximize=True
    ),
}


def _torch_adamw(ps):
    return torch.optim.AdamW(ps, foreach=True)


def _torch_sgd(ps):
    return torch.optim.SGD(ps, lr=1e-3, momentum=0.9, foreach=True)


@pytest.fixture
def two_threads():
    """Two torch threads, whatever an earlier test left: the CPU chunk is per thread, and the
    layout's 0.49M-element bucket is one chunk (the "lists" mode) only from two threads on."""
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


@pytest.mark.parametrize(
    ("make", "reference"),
    [(m, _torch_adamw) for m in AM_ADAMW_KINDS.values()]
    + [(m, _torch_sgd) for m in AMSGD_KINDS.values()],
    ids=[f"AMAdamW-{k}" for k in AM_ADAMW_KINDS] + [f"AMSGD-{k}" for k in AMSGD_KINDS],
)
def test_cpu_foreach_ops_per_step_within_torch_bound(make, reference, two_threads):
    """At most ``1.5 x + 40`` torch's foreach step's operators, at 148 and 1480 tensors,
    and as many at both counts (torch's AdamW reads each step counter on the host: two
    operators per tensor)."""
    counts = {}
    for n in (148, 1480):
        ours = _ops_per_step(make, _layout(n)).total
        theirs = _ops_per_step(reference, _layout(n)).total
        assert ours <= 1.5 * theirs + 40, (n, ours, theirs)
        counts[n] = ours
    assert counts[148] == counts[1480], counts


@pytest.fixture
def device_strategy(monkeypatch):
    monkeypatch.setattr(common, "FORCE_DEVICE_STRATEGY", True)


def _small_layout(n_blocks: int) -> list[tuple[int, ...]]:
    return [(7, 5), (5,), (3, 2, 4), (1,)] * n_blocks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize(
    "make",
    list(AM_ADAMW_KINDS.values()) + list(AMSGD_KINDS.values()),
    ids=[f"AMAdamW-{k}" for k in AM_ADAMW_KINDS] + [f"AMSGD-{k}" for k in AMSGD_KINDS],
)
def test_device_strategy_ops_do_not_grow_with_the_tensor_count(make, dtype, device_strategy):
    """Multi-tensor ops and other kernels per step: the same at 8 and at 80 tensors;
    what grows is 1-D views only (each tensor seen flat: no kernel)."""
    small = _ops_per_step(make, _small_layout(2), dtype)
    large = _ops_per_step(make, _small_layout(20), dtype)
    assert small.kinds["foreach"] == large.kinds["foreach"]
    assert small.kinds["other"] == large.kinds["other"], (small.names, large.names)
    per_tensor = {k for k in large.names if large.names[k] > small.names[k]}
    views = {k for k in per_tensor if getattr(torch.ops.aten, k).default.is_view}
    assert per_tensor == views, per_tensor - views
    assert large.kinds["view"] <= 4 * 80 + small.kinds["view"]
    assert small.slow == large.slow == [], large.slow


@pytest.mark.parametrize("case", optim_tests.VALID, ids=case_id)
def test_device_strategy_matches_single_tensor(case, device_strategy):
    info, inp = case
    prob = optim_tests._problem()
    kwargs = info.kwargs(inp)
    single, betas_s, _, _ = run_torch(info, kwargs, prob, prob.x0(), N_STEPS, foreach=False)
    multi, betas_m, _, _ = run_torch(info, kwargs, prob, prob.x0(), N_STEPS, foreach=True)
    tol = optim_tests.FOREACH_TOL
    optim_tests.assert_iterates_close(multi, single, tol, "device strategy vs single")
    np.testing.assert_allclose(betas_m, betas_s, rtol=tol, atol=tol)


@pytest.fixture
def cpu_chunks(monkeypatch):
    """CPU chunks of 100 elements: the 256-element tensors below are cut into pieces."""
    monkeypatch.setattr(common, "CPU_CHUNK", 100)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)


@pytest.mark.parametrize("per_layer", [False, True], ids=["global", "per-layer"])
@pytest.mark.parametrize("scale", beta_scale.SCALES)
def test_cpu_chunks_betas_are_scale_invariant(scale, per_layer, cpu_chunks):
    """AM-AdamW's chunks (and AMSGD's whole tensors): beta is that of the unscaled data."""
    test_device_strategy_betas_are_scale_invariant(scale, per_layer, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_cpu_sqsums_keep_the_float32_range(dtype):
    """AMSGD's sums of squares in CPU chunks (half precision) against float64 sums: float32
    squares of 1e-25 or 1e25 would underflow or overflow; zeros stay zero."""
    gen = torch.Generator().manual_seed(0)
    pieces = [
        (s * torch.randn(n, generator=gen, dtype=torch.float64)).to(dtype)
        for s in (1e-30, 1e-25, 1e-20, 1e-3, 1.0, 1e20, 1e25, 1e30)
        for n in (1, 100, 3000)
    ]
    pieces += [torch.zeros(50, dtype=dtype), torch.tensor([0.0, 1e-30, 0.0], dtype=dtype)]
    buffers = [torch.empty(t.shape, dtype=torch.float32) for t in pieces]
    got = common.cpu_sqsums(pieces, buffers)
    ref = torch.stack([(t.double() ** 2).sum() for t in pieces])
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, ref, rtol=3000 * 2.0**-24, atol=0.0)


def test_cpu_sqsums_zero_pieces_below_the_rule_threshold(monkeypatch):
    """AMSGD's <v,v> pieces that sum to 0 in float32: with the piece's <g,g> + <d,d> given,
    those whose true sum could only lie under the rule's threshold eps^2 * ref are read as
    zero without a pass over them; the others (a small ref) still get their exact sum."""
    tiny = torch.full((1000,), 1e-25)  # squares 1e-50: 0 in float32
    zeros = torch.zeros(1000)
    passes = []
    real = torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda t: passes.append(t.numel()) or real(t))
    # a large ref: numel * 2^-126 = 1.2e-35 <= eps^2 * 1e4 = 4.9e-28: no pass, read as 0
    got = common.cpu_sqsums([tiny, zeros], ref=torch.tensor([1e4, 1e4], dtype=torch.float64))
    assert got.tolist() == [0.0, 0.0] and passes == []
    assert 1000 * 1e-50 <= common._RULE_TINY * 1e4  # the true sum is under the threshold
    # a small ref: the zero test runs, the tiny piece is summed again exactly
    got = common.cpu_sqsums([tiny, zeros], ref=torch.tensor([1e-20, 1e-20], dtype=torch.float64))
    assert passes == [1000, 1000]
    assert got[0].item() == pytest.approx(1000 * 1e-50, rel=1e-6) and got[1].item() == 0.0


@pytest.mark.parametrize("per_layer", [False, True], ids=["global", "per-layer"])
@pytest.mark.parametrize("scale", beta_scale.SCALES)
def test_device_strategy_betas_are_scale_invariant(scale, per_layer, device_strategy):
    rtol = beta_scale.RTOL
    ref = beta_scale._amsgd(1.0, True, per_layer)
    assert beta_scale._amsgd(scale, True, per_layer) == pytest.approx(ref, rel=rtol)
    ref = beta_scale._am_adamw(1.0, True, per_layer, eps_unit=2.0**40)
    got = beta_scale._am_adamw(scale, True, per_layer, eps_unit=2.0**40)
    assert got == pytest.approx(ref, rel=rtol)


def _first_chunk_mode(monkeypatch):
    seen = []
    real = common.foreach_mode

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(common, "foreach_mode", spy)
    return seen


def test_cpu_modes_follow_the_bucket_size(monkeypatch):
    """Small CPU buckets run whole tensors; larger ones (and half precision) run chunks."""
    seen = _first_chunk_mode(monkeypatch)
    monkeypatch.setattr(common, "CPU_CHUNK", 64)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    for shapes, dtype in (([(8,)], torch.float32), ([(65,)], torch.float32)):
        _ops_per_step(lambda ps: AMAdamW(ps, foreach=True), shapes, dtype, n_warm=0)
    _ops_per_step(lambda ps: AMSGD(ps, foreach=True), [(8,)], torch.bfloat16, n_warm=0)
    assert seen == ["lists", "chunks", "chunks"]


# --------------------------------------------------------------------------- CUDA

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _cuda_kernels_per_step(make, shapes, dtype):
    """Kernels a step runs on the GPU, by name (CUDA activity of one profiled step)."""
    from collections import Counter

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).to("cuda", dtype)) for s in shapes]
    for p in params:
        p.grad = (1e-2 * torch.randn(p.shape, generator=gen)).to("cuda", dtype)
    opt = make(params)
    for _ in range(2):
        opt.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        opt.step()
        torch.cuda.synchronize()
    return Counter(
        {e.key: e.count for e in prof.key_averages() if e.device_type == DeviceType.CUDA}
    )


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize(
    "make",
    list(AM_ADAMW_KINDS.values()) + list(AMSGD_KINDS.values()),
    ids=[f"AMAdamW-{k}" for k in AM_ADAMW_KINDS] + [f"AMSGD-{k}" for k in AMSGD_KINDS],
)
def test_cuda_foreach_launches_do_not_grow_with_the_tensor_count(make, dtype):
    """No kernel runs once per tensor: from 4 to 28 tensors each kernel's count grows
    by at most one (torch's multi-tensor and concatenation kernels take a bounded
    number of tensors per launch and split a longer list), never by the 24 tensors
    added, and no kernel appears that did not run at 4 tensors."""
    small = _cuda_kernels_per_step(make, _small_layout(1), dtype)
    large = _cuda_kernels_per_step(make, _small_layout(7), dtype)
    assert sum(small.values()) > 0
    grown = {k: (small[k], n) for k, n in large.items() if n > small[k] + 1 or not small[k]}
    assert not grown, grown


@cuda
@pytest.mark.parametrize("cls", [AMSGD, AMAdamW], ids=lambda c: c.__name__)
def test_cuda_foreach_matches_single_tensor(cls):
    shapes = _small_layout(3)
    runs = []
    for foreach in (False, True):
        gen = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(s, generator=gen).cuda()) for s in shapes]
        opt = cls(params, lr=1e-2, foreach=foreach, per_layer=True)
        for step in range(5):
            gen_g = torch.Generator().manual_seed(step)
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen_g).cuda()
            opt.step()
        runs.append([p.detach().cpu() for p in params])
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
