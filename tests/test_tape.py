"""The rules recorded as tapes (amopt.core.tape) and run by the fused kernels' evaluator.

Oracle: the rule itself, run by NumPy on the same float64 sums. Both evaluate the same
IEEE operations in the same order with one rounding each, so they must agree bit for
bit, NaN, infinities, signed zeros and the degenerate guards included.
"""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest

from amopt.core import rule as _rule
from amopt.core import tape as _tape
from amopt.core.config import AMConfig

torch = pytest.importorskip("torch")

from amopt.torch import AMSGD, AMAdamW, _fused  # noqa: E402

KERNELS = _fused.library()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason="no fused kernels here")

CONFIGS = [
    {},
    {"lam": 0.0},
    {"lam": 2.5, "beta_max": 0.99},
    {"variant": "clip", "beta_min": 0.4},
    {"variant": "restart", "theta": 0.6, "beta_high": 0.95, "beta_low": 0.05},
]


def _ids(options: dict) -> str:
    return ",".join(map(str, options.values())) or "default"


SPECIAL = [0.0, -0.0, 1.0, -1.0, 1e-300, -1e-300, 1e300, np.inf, -np.inf, np.nan, 0.5, 3.0]


def _sums(seed: int) -> np.ndarray:
    """Random scopes of every sign and scale, and every triple of special values."""
    rng = np.random.default_rng(seed)
    random = rng.standard_normal((400, 3)) * 10.0 ** rng.integers(-30, 30, (400, 1))
    positive = np.abs(rng.standard_normal((200, 3)))
    special = np.array(list(itertools.product(SPECIAL, repeat=3)))
    return np.concatenate([random, positive, special])


def _run_tape(tape, rows: np.ndarray) -> np.ndarray:
    code, outs = tape
    rows = np.ascontiguousarray(rows, dtype=np.float64)
    out = np.empty((rows.shape[0], len(outs)))
    status = KERNELS.tape_eval(
        code.ctypes.data, len(code), rows.ctypes.data, rows.shape[0], 3,
        outs.ctypes.data, len(outs), out.ctypes.data,
    )  # fmt: skip
    assert status == 0
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    np.testing.assert_array_equal(np.where(both_nan, 0.0, a).view(np.int64),
                                  np.where(both_nan, 0.0, b).view(np.int64))  # fmt: skip


#: The two evaluators of a tape: the fused kernels' (C) and straight-line Python on floats
#: (amopt.core.tape.python_rule, which the NumPy minimize loop runs for its one scope).
EVALUATORS = [pytest.param("kernels", marks=needs_kernels), "python"]


def _evaluate(evaluator: str, rule, rows: np.ndarray, **kwargs) -> np.ndarray:
    """``rule`` recorded and run by ``evaluator`` on each row of ``rows`` (3 sums each)."""
    if evaluator == "kernels":
        tape = _tape.traced(rule, 3, **kwargs)
        assert tape is not None
        return _run_tape(tape, rows)
    fn = _tape.python_rule(rule, 3, **kwargs)
    assert fn is not None
    return _python_rows(fn, rows)


def _python_rows(fn, rows: np.ndarray) -> np.ndarray:
    return np.array([fn(row) for row in rows.tolist()], dtype=np.float64)


@pytest.mark.parametrize("evaluator", EVALUATORS)
@pytest.mark.parametrize("options", CONFIGS, ids=_ids)
def test_momentum_tape_matches_the_rule_bit_for_bit(evaluator, options):
    cfg = AMConfig.cached(numerator="linear", **options)
    rows = _sums(1)
    with np.errstate(all="ignore"):
        beta, gamma = _rule.momentum_beta(np, rows, cfg)
    out = _evaluate(evaluator, _rule.momentum_beta, rows, cfg=cfg)
    _same_bits(out[:, 0], beta)
    _same_bits(out[:, 1], gamma)


@pytest.mark.parametrize("evaluator", EVALUATORS)
@pytest.mark.parametrize("options", CONFIGS, ids=_ids)
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adam_tape_matches_the_rule_bit_for_bit(evaluator, options, weight_decay):
    cfg = AMConfig.cached(numerator="linear", **options)
    rows = _sums(2)
    with np.errstate(all="ignore"):
        beta = _rule.adam_beta(np, rows, cfg, lr=1e-3, weight_decay=weight_decay)
    out = _evaluate(evaluator, _rule.adam_beta, rows, cfg=cfg, lr=1e-3, weight_decay=weight_decay)
    _same_bits(out[:, 0], beta)


@pytest.mark.parametrize("options", CONFIGS, ids=_ids)
def test_python_exact_momentum_rule_matches_the_rule_bit_for_bit(options):
    """The exact numerator, ``f_decrease`` a sixth input, against the rule run with it as
    a Python float (as ``minimize`` passes it), one scope at a time."""
    from amopt.backends import numpy as _numpy_fast

    cfg = AMConfig.cached(numerator="exact", **options)
    lr = 0.3
    fn = _tape.python_rule(_numpy_fast._exact_rule, 6, base=_rule.momentum_beta, cfg=cfg, lr=lr)
    assert fn is not None
    rng = np.random.default_rng(4)
    five = np.concatenate([_sums(4), _sums(5)[:, :2]], axis=1)[::3]
    f_dec = np.concatenate([rng.standard_normal(len(five) - len(SPECIAL)), SPECIAL])
    rows = np.concatenate([five, f_dec[:, None]], axis=1)
    out = _python_rows(fn, rows)
    with np.errstate(all="ignore"):
        for row, got in zip(rows, out, strict=True):
            beta, gamma = _rule.momentum_beta(np, row[:5], cfg, lr=lr, f_decrease=float(row[5]))
            _same_bits(got, np.array([beta, gamma]))


@pytest.mark.parametrize(
    "f_decrease",
    [None, 0.25, np.float64(-1e-3), np.float32(0.125), np.array(2.0), np.array(0.5, np.float32)],
    ids=["linear", "float", "float64", "float32", "0-d", "0-d float32"],
)
def test_the_numpy_loops_rule_is_the_rule_for_every_kind_of_f_decrease(f_decrease):
    """The NumPy fast path runs the Python tape for float64 f_decrease and the rule itself
    otherwise (a float32 one promotes differently): the result is the rule's either way."""
    from amopt.backends import numpy as _numpy_fast

    numerator = "linear" if f_decrease is None else "exact"
    cfg = AMConfig.cached(numerator=numerator, lam=0.5, beta_max=0.95)
    sums = np.array([2.0, 3.0, 1.5, -0.25, 0.75])
    for _ in range(2):  # the second call takes the remembered function
        beta, gamma = _numpy_fast._one_scope_rule(sums, cfg, 0.1, f_decrease)
        want = _rule.momentum_beta(np, sums, cfg, lr=0.1, f_decrease=f_decrease)
        assert isinstance(beta, np.ndarray) and beta.dtype == want[0].dtype
        _same_bits(np.array([beta, gamma]), np.array(want))


def test_a_rule_that_branches_on_data_is_not_recorded():
    def branching(xp, sums, cfg, **kw):
        return sums[..., 0] if sums[..., 1] > 0 else sums[..., 2]  # a Python if on a value

    def converting(xp, sums, cfg, **kw):
        return xp.zeros_like(sums[..., 0]) + float(sums[..., 0])

    cfg = AMConfig.cached()
    assert _tape.trace(branching, 3, cfg=cfg) is None
    assert _tape.trace(converting, 3, cfg=cfg) is None


@needs_kernels
def test_a_malformed_tape_is_refused():
    code, outs = _tape.traced(_rule.momentum_beta, 3, cfg=AMConfig.cached())
    rows = np.zeros((1, 3))
    out = np.empty((1, 2))
    for field, value in (("op", 99), ("a", 10_000)):
        bad = code.copy()
        bad[field][-1] = value
        status = KERNELS.tape_eval(bad.ctypes.data, len(bad), rows.ctypes.data, 1, 3,
                                   outs.ctypes.data, 2, out.ctypes.data)  # fmt: skip
        assert status == -1
    too_far = np.array([len(code)], dtype=np.int64)
    assert KERNELS.tape_eval(code.ctypes.data, len(code), rows.ctypes.data, 1, 3,
                             too_far.ctypes.data, 1, out.ctypes.data) == -1  # fmt: skip


def _train(cls, *, record: bool, per_layer: bool, monkeypatch, **kwargs):
    """Five fused steps on fixed gradients, the rule run as a tape or by NumPy."""
    if not record:
        monkeypatch.setattr(_tape, "traced", lambda *a, **k: None)
    gen = torch.Generator().manual_seed(5)
    params = [torch.randn(n, generator=gen) for n in (5000, 3, 700, 1, 2048)]
    opt = cls([p.clone() for p in params], lr=1e-2, per_layer=per_layer, fused=True, **kwargs)
    betas = []
    for _ in range(5):
        for p in opt.param_groups[0]["params"]:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
        betas.append([float(b) for row in opt.latest_betas() for b in row])
    monkeypatch.undo()
    return opt, betas


@needs_kernels
@pytest.mark.parametrize("cls", [AMSGD, AMAdamW])
@pytest.mark.parametrize("per_layer", [True, False])
@pytest.mark.parametrize("chunk", ["1", "100000000"])
def test_steps_with_the_tape_equal_steps_with_the_rule_between_the_passes(
    monkeypatch, cls, per_layer, chunk
):
    """Bit for bit: the same sums, the same rule operations, the same rounding."""
    monkeypatch.setenv("AMOPT_FUSED_CHUNK_BYTES", chunk)
    kwargs = {"weight_decay": 0.05}
    taped, taped_betas = _train(cls, record=True, per_layer=per_layer,
                                monkeypatch=monkeypatch, **kwargs)  # fmt: skip
    monkeypatch.setenv("AMOPT_FUSED_CHUNK_BYTES", chunk)
    ruled, ruled_betas = _train(cls, record=False, per_layer=per_layer,
                                monkeypatch=monkeypatch, **kwargs)  # fmt: skip
    assert taped_betas == ruled_betas
    assert any(0.0 < b < 0.9 for row in taped_betas for b in row)  # betas that vary
    for p, q in zip(taped.param_groups[0]["params"], ruled.param_groups[0]["params"], strict=True):
        assert torch.equal(p, q)
        for key, value in taped.state[p].items():
            torch.testing.assert_close(value, ruled.state[q][key], rtol=0, atol=0)


def test_traced_tapes_are_cached_per_rule_and_arguments():
    cfg = AMConfig.cached()
    first = _tape.traced(_rule.adam_beta, 3, cfg=cfg, lr=1e-3, weight_decay=0.0)
    assert _tape.traced(_rule.adam_beta, 3, cfg=cfg, lr=1e-3, weight_decay=0.0) is first
    other = _tape.traced(_rule.momentum_beta, 3, cfg=cfg)
    assert other is not first and len(other[1]) == 2 and len(first[1]) == 1
    assert ctypes.sizeof(ctypes.c_double) * 3 == _tape.INSN.itemsize  # the C struct's size
