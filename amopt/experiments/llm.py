"""``llm``: LLaMA-architecture pre-training, AdamW vs AM-AdamW (paper Sec. 4.3, 4.5-4.7, Supp. D).

The paper pre-trains 20M-1B LLaMA models on C4 for 1k steps of 10^6 tokens. On a
CPU we pre-train two tiny LLaMA models (transformers' ``LlamaConfig`` /
``LlamaForCausalLM`` built from a config, no download; byte-level vocabulary of
256, untied embeddings, RMSNorm eps 1e-6, init range 0.02, float32) on
tiny-shakespeare (the last 10% of the bytes held out for validation), with
random contiguous windows as batches. The paper's hyper-parameters are kept
where they make sense at this scale: lr 1e-3, weight decay 1e-4 (decoupled, on
every tensor), betas (0.9, 0.999), eps 1e-8, gradient clipping at norm 1.0,
cosine schedule to 0 with or without a 10% linear warm-up, AM-AdamW lam 0.1
with one beta per tensor (``per_layer=True``). Every run of a model size starts
from the same initialisation and sees the same batches; the four warm-up /
no-warm-up runs are repeated with ``main_seeds`` seeds (initialisation and batch
order), the others use the first seed only.

Runs per size: AdamW and AM-AdamW with and without warm-up (beta_max = beta_1 = 0.9);
beta_max = beta_1 in {0.95, 0.99} for both (with warm-up); AM-AdamW "clip"
(beta_min = 0.5) and "restart" (theta = 0.7, 0.9 / 0.1) variants (with warm-up).
Validation loss every ``eval_every`` steps on fixed held-out windows.

Overhead: a separate timing loop on a fixed batch measures the time of a whole
iteration (forward, backward, clipping, step) and of ``optimizer.step()`` alone
(median over rounds) for AdamW and AM-AdamW in each implementation of
:data:`IMPLEMENTATIONS` (single-tensor, foreach, fused), all alternating in rounds.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from amopt.bench._timing import PhaseClock, timed_rounds

from ._common import (
    RunContext,
    claim_verdict,
    implementation_note,
    markdown_summary,
    optimizer_path,
    torch_threads,
)
from ._data import load_text, split_text
from ._plots import STYLES, pyplot, save_figure

__all__ = ["run", "summary_markdown", "make_model", "SIZES"]

TITLE = "Tiny LLaMA pre-training on tiny-shakespeare: AdamW vs AM-AdamW (paper Sec. 4.3)"

#: Model sizes: name -> LlamaConfig arguments.
SIZES: dict[str, dict[str, int]] = {
    "0.18M": {
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
    },
    "0.87M": {
        "hidden_size": 128,
        "intermediate_size": 352,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
    },
}
QUICK_SIZES: dict[str, dict[str, int]] = {
    "tiny-a": {
        "hidden_size": 32,
        "intermediate_size": 88,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
    },
    "tiny-b": {
        "hidden_size": 48,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
    },
}
REAL: dict[str, Any] = {
    "steps": 300,
    "batch_size": 16,
    "context": 128,
    "eval_every": 25,
    "eval_batches": 8,
    "lr": 1e-3,
    "weight_decay": 1e-4,
    "beta2": 0.999,
    "eps": 1e-8,
    "grad_clip": 1.0,
    "warmup": 0.1,
    "lam": 0.1,
    "beta_maxes": [0.95, 0.99],
    "variants": {
        "clip": {"beta_min": 0.5},
        "restart": {"theta": 0.7, "beta_high": 0.9, "beta_low": 0.1},
    },
    "timing": {"rounds": 5, "iters": 10, "warmup_iters": 3},
    # seeds (initialisation and batch order) of the four warm-up / no-warm-up runs per size
    "main_seeds": {"0.18M": 3, "0.87M": 2},
}
QUICK: dict[str, Any] = {
    **REAL,
    "steps": 20,
    "batch_size": 4,
    "context": 32,
    "eval_every": 10,
    "eval_batches": 2,
    "timing": {"rounds": 2, "iters": 3, "warmup_iters": 1},
    "main_seeds": {"tiny-a": 2, "tiny-b": 1},
}

#: The runs repeated over ``main_seeds`` seeds.
MAIN_RUNS = (
    "AdamW (warm-up)",
    "AdamW (no warm-up)",
    "AM-AdamW (warm-up)",
    "AM-AdamW (no warm-up)",
)


def _plan(cfg: dict[str, Any]) -> dict[str, tuple[str, float, bool, str | None]]:
    """The runs of one size: label -> (optimizer, beta_max, warm-up, variant)."""
    plan: dict[str, tuple[str, float, bool, str | None]] = {
        "AdamW (warm-up)": ("AdamW", 0.9, True, None),
        "AdamW (no warm-up)": ("AdamW", 0.9, False, None),
        "AM-AdamW (warm-up)": ("AM-AdamW", 0.9, True, None),
        "AM-AdamW (no warm-up)": ("AM-AdamW", 0.9, False, None),
    }
    for bm in cfg["beta_maxes"]:
        plan[f"AdamW beta1={bm}"] = ("AdamW", bm, True, None)
        plan[f"AM-AdamW beta_max={bm}"] = ("AM-AdamW", bm, True, None)
    for v in cfg["variants"]:
        plan[f"AM-AdamW ({v})"] = ("AM-AdamW", 0.9, True, v)
    return plan


def make_model(size: dict[str, int], context: int, seed: int) -> Any:
    """A ``LlamaForCausalLM`` with a byte vocabulary, built from a config (no download).

    Parameters
    ----------
    size : dict
        ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
        ``num_attention_heads`` (as in :data:`SIZES`).
    context : int
        Maximum sequence length.
    seed : int
        ``torch.manual_seed`` before the weights are initialised.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256,
        num_key_value_heads=size["num_attention_heads"],
        max_position_embeddings=context,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        tie_word_embeddings=False,
        hidden_act="silu",
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **size,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def _lr_lambda(total: int, warmup: int) -> Any:
    def f(step: int) -> float:
        if step < warmup:
            return step / max(warmup, 1)
        progress = (step - warmup) / max(total - warmup, 1)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return f


#: Optimizer implementations timed by the overhead loop: name -> constructor flags.
IMPLEMENTATIONS: dict[str, dict[str, bool]] = {
    "single-tensor": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def _optimizer(
    name: str,
    params: Any,
    cfg: dict[str, Any],
    beta_max: float,
    variant: str | None,
    impl: dict[str, bool] | None = None,
) -> Any:
    """``torch.optim.AdamW`` or :class:`amopt.torch.AMAdamW` with the experiment's settings.

    ``impl`` holds ``foreach`` / ``fused`` flags (default: the library defaults).
    """
    import torch

    from amopt.torch import AMAdamW

    betas = (beta_max, cfg["beta2"])
    flags = dict(impl or {})
    if name == "AdamW":
        return torch.optim.AdamW(
            params,
            lr=cfg["lr"],
            betas=betas,
            eps=cfg["eps"],
            weight_decay=cfg["weight_decay"],
            **flags,
        )
    extra = {"variant": variant, **cfg["variants"][variant]} if variant else {}
    return AMAdamW(
        params,
        lr=cfg["lr"],
        betas=betas,
        eps=cfg["eps"],
        weight_decay=cfg["weight_decay"],
        lam=cfg["lam"],
        per_layer=True,
        **flags,
        **extra,
    )


class _Batches:
    """Random contiguous windows of the training bytes; fixed windows of the held-out bytes."""

    def __init__(
        self, train: np.ndarray, val: np.ndarray, cfg: dict[str, Any], seed: int, device: str
    ):
        import torch

        self.torch = torch
        self.train = torch.from_numpy(train.astype(np.int64))
        T, B = cfg["context"], cfg["batch_size"]
        rng = np.random.default_rng(seed)
        self.starts = rng.integers(0, len(train) - T - 1, size=(cfg["steps"], B))
        n_val = cfg["eval_batches"] * B
        vstarts = np.linspace(0, len(val) - T - 1, n_val).astype(np.int64)
        v = torch.from_numpy(val.astype(np.int64))
        self.val = torch.stack([v[s : s + T] for s in vstarts]).to(device)
        self.T, self.B, self.device = T, B, device

    def train_batch(self, step: int) -> Any:
        rows = [self.train[s : s + self.T] for s in self.starts[step]]
        return self.torch.stack(rows).to(self.device)

    def val_loss(self, model: Any) -> float:
        model.eval()
        total = 0.0
        with self.torch.no_grad():
            for i in range(0, self.val.shape[0], self.B):
                x = self.val[i : i + self.B]
                total += float(model(input_ids=x, labels=x).loss)
        model.train()
        return total / math.ceil(self.val.shape[0] / self.B)


def _train(
    ctx: RunContext,
    size: dict[str, int],
    cfg: dict[str, Any],
    batches: _Batches,
    label: str,
    spec: tuple[str, float, bool, str | None],
    seed: int,
) -> dict[str, Any]:
    import torch

    opt_name, beta_max, warm, variant = spec
    device = batches.device
    model = make_model(size, cfg["context"], seed).to(device)
    names = [n for n, _ in model.named_parameters()]
    opt = _optimizer(opt_name, model.parameters(), cfg, beta_max, variant)
    total = cfg["steps"]
    warmup = int(round(cfg["warmup"] * total)) if warm else 0
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(total, warmup))
    train_loss, betas, iter_s, step_s = [], [], [], []
    val = [(0, batches.val_loss(model))]
    bar = ctx.progress(total=total, desc=label, unit="step")
    diverged = False
    clock = _clock(device)
    for step in range(total):
        x = batches.train_batch(step)
        phases = _iteration(model, opt, x, cfg["grad_clip"], clock)
        loss = phases["loss"]
        sched.step()
        iter_s.append(phases["iter"])
        step_s.append(phases["step"])
        value = loss.item()
        train_loss.append(value)
        if opt_name == "AM-AdamW":
            betas.append(torch.stack(opt.latest_betas()[0]).float().cpu().numpy())
        if (step + 1) % cfg["eval_every"] == 0 or step + 1 == total:
            val.append((step + 1, batches.val_loss(model)))
        bar.update(1)
        if not math.isfinite(value):
            diverged = True
            break
    bar.close()
    skip = min(5, len(iter_s) - 1)
    out = {
        "label": label,
        "optimizer": opt_name,
        "beta_max": beta_max,
        "warmup_steps": warmup,
        "variant": variant,
        "train_loss": np.asarray(train_loss),
        "val": val,
        "final_val_loss": val[-1][1] if not diverged else None,
        "min_val_loss": min(v for _, v in val) if not diverged else None,
        "diverged": diverged,
        "mean_iter_s": float(np.mean(iter_s[skip:])),
        "mean_step_s": float(np.mean(step_s[skip:])),
        "param_names": names,
    }
    if betas:
        out["betas"] = np.stack(betas)  # (steps, tensors)
    return out


def _clock(device: str) -> PhaseClock:
    """A phase clock that waits for the GPU's queued work before each mark."""
    import torch

    return PhaseClock(torch.cuda.synchronize if device.startswith("cuda") else None)


def _iteration(
    model: Any, opt: Any, x: Any, grad_clip: float, clock: PhaseClock
) -> dict[str, Any]:
    """One training iteration on the batch ``x``, timed in phases.

    Returns ``{"iter": s, "step": s, "loss": tensor}``: the whole iteration
    (forward, backward, clipping, step) and ``optimizer.step()`` alone, in seconds.
    """
    import torch

    clock.start()
    loss = model(input_ids=x, labels=x).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    clock.lap()
    opt.step()
    step = clock.lap()
    return {"iter": clock.total, "step": step, "loss": loss}


def _timing(
    ctx: RunContext, size: dict[str, int], cfg: dict[str, Any], batches: _Batches, seed: int
) -> dict[str, Any]:
    """Median per-iteration and per-``step()`` seconds of AdamW and AM-AdamW.

    Every implementation of :data:`IMPLEMENTATIONS` that the installed torch and amopt
    support is timed with :func:`amopt.bench._timing.timed_rounds`: in each round
    every setup runs ``iters`` iterations on a fixed batch (the round's sample is
    their median), the setups alternating in order from round to round; the result
    is the median over the rounds. A ``fused=True`` that falls back to another
    implementation (warning) is reported as unavailable.
    """
    import warnings

    tcfg = cfg["timing"]
    device = batches.device
    x = batches.train_batch(0)
    clock = _clock(device)
    setups = {}
    unavailable: dict[str, str] = {}

    def one(model: Any, opt: Any) -> dict[str, float]:
        phases = _iteration(model, opt, x, cfg["grad_clip"], clock)
        return {"iter": phases["iter"], "step": phases["step"]}

    for impl, flags in IMPLEMENTATIONS.items():
        pair = {}
        for name in ("AdamW", "AM-AdamW"):
            model = make_model(size, cfg["context"], seed).to(device)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    opt = _optimizer(name, model.parameters(), cfg, 0.9, None, flags)
                    for _ in range(tcfg["warmup_iters"]):
                        one(model, opt)
            except (TypeError, ValueError, RuntimeError, UserWarning) as exc:
                unavailable[f"{name} {impl}"] = f"{type(exc).__name__}: {exc}"[:300]
                break
            pair[name] = (model, opt)
        if len(pair) == 2:
            for name, mo in pair.items():
                setups[(name, impl)] = mo
    times = timed_rounds(
        {key: functools.partial(one, *mo) for key, mo in setups.items()},
        rounds=tcfg["rounds"],
        inner=tcfg["iters"],
        reduce=statistics.median,
        progress=lambda rounds: ctx.progress(rounds, desc="timing", unit="round"),
    )
    out: dict[str, Any] = {"unavailable": unavailable}
    for (name, impl), t in times.items():
        out[f"{name} {impl}"] = {
            "iter_s": float(np.median(t["iter"])),
            "step_s": float(np.median(t["step"])),
        }
    for impl in IMPLEMENTATIONS:
        if (f"AM-AdamW {impl}") not in out or f"AdamW {impl}" not in out:
            continue
        a, b = out[f"AM-AdamW {impl}"], out[f"AdamW {impl}"]
        out[f"overhead {impl}"] = {
            "iter_pct": 100.0 * (a["iter_s"] - b["iter_s"]) / b["iter_s"],
            "step_diff_pct_of_iter": 100.0 * (a["step_s"] - b["step_s"]) / b["iter_s"],
            "step_ratio": a["step_s"] / b["step_s"],
        }
    return out


def timing_lines(size_name: str, timing: dict[str, Any]) -> list[str]:
    """The log lines of one model size's overhead measurement (:func:`_timing`), one per
    implementation: both optimizers' milliseconds per iteration and per ``step()``, and
    what AM-AdamW adds."""
    lines = []
    for impl in IMPLEMENTATIONS:
        a, b = timing.get(f"AM-AdamW {impl}"), timing.get(f"AdamW {impl}")
        over = timing.get(f"overhead {impl}")
        if a is None or b is None or over is None:
            continue
        lines.append(
            f"[llm] {size_name} {impl}: ms per iteration (step()) AdamW "
            f"{b['iter_s'] * 1e3:.2f} ({b['step_s'] * 1e3:.2f}), AM-AdamW "
            f"{a['iter_s'] * 1e3:.2f} ({a['step_s'] * 1e3:.2f}); AM-AdamW adds "
            f"{over['iter_pct']:+.1f}% per iteration (step() difference "
            f"{over['step_diff_pct_of_iter']:+.1f}% of an iteration)"
        )
    for name, why in timing.get("unavailable", {}).items():
        lines.append(f"[llm] {size_name} {name}: not timed ({why})")
    return lines


def _steps_to(val: list[tuple[int, float]], target: float) -> float | None:
    """First step (linear interpolation between evaluations) with validation loss <= target."""
    for (s0, v0), (s1, v1) in zip(val, val[1:], strict=False):
        if v1 <= target:
            if v0 <= target:
                return float(s0)
            return s0 + (s1 - s0) * (v0 - target) / (v0 - v1)
    return None


def run(ctx: RunContext) -> dict[str, Any]:
    """Run the experiment with ``ctx.threads`` torch threads (see the module docstring)."""
    with torch_threads(ctx.threads):
        return _run(ctx)


def _run(ctx: RunContext) -> dict[str, Any]:
    """Run the LLM experiment (see the module docstring)."""
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the llm experiment needs transformers: pip install transformers "
            "(or pip install amopt[experiments])"
        ) from exc
    transformers.logging.set_verbosity_error()
    cfg = QUICK if ctx.quick else REAL
    sizes = QUICK_SIZES if ctx.quick else SIZES
    t_start = time.perf_counter()
    device = ctx.torch_device()
    data = load_text(data_dir=ctx.data_dir, download=ctx.download)
    train, val = split_text(data, 0.1)
    ctx.log(f"[llm] {len(train)} training bytes, {len(val)} held-out bytes, on {device}")
    plan = _plan(cfg)
    results: dict[str, Any] = {}
    runs_all: dict[str, dict[str, Any]] = {}
    for size_name, size in sizes.items():
        batches = _Batches(train, val, cfg, ctx.seed, device)
        n_params = sum(p.numel() for p in make_model(size, cfg["context"], 0).parameters())
        runs = {}
        for label, spec in plan.items():
            r = _train(ctx, size, cfg, batches, f"{size_name} {label}", spec, ctx.seed)
            runs[label] = r
            ctx.log(
                f"[llm] {size_name} {label}: final validation loss "
                f"{r['final_val_loss']:.4f} nats/byte, {r['mean_iter_s'] * 1e3:.1f} ms/iteration"
            )
        finals = {label: [runs[label]["final_val_loss"]] for label in MAIN_RUNS}
        for k in range(1, cfg["main_seeds"].get(size_name, 1)):
            seed = ctx.seed + k
            seed_batches = _Batches(train, val, cfg, seed, device)
            for label in MAIN_RUNS:
                r = _train(ctx, size, cfg, seed_batches, f"{size_name} {label} seed {seed}",
                           plan[label], seed)  # fmt: skip
                finals[label].append(r["final_val_loss"])
                ctx.log(
                    f"[llm] {size_name} {label} seed {seed}: final validation loss "
                    f"{r['final_val_loss']:.4f} nats/byte"
                )
        timing = _timing(ctx, size, cfg, batches, ctx.seed)
        for line in timing_lines(size_name, timing):
            ctx.log(line)
        runs_all[size_name] = runs
        results[size_name] = _size_summary(size_name, size, n_params, runs, timing, cfg)
        results[size_name]["seeds"] = _seed_summary(finals, ctx.seed)
    plots = [_plot_val(ctx, runs_all, cfg), _plot_betas(ctx, runs_all)]
    curves = {
        size_name: {
            label: {
                "val": [[s, v] for s, v in r["val"]],
                "train_loss": ctx.curve(r["train_loss"], 200),
                **(
                    {
                        "beta_mean": ctx.curve(r["betas"].mean(axis=1), 200),
                        "beta_min": ctx.curve(r["betas"].min(axis=1), 200),
                        "beta_max": ctx.curve(r["betas"].max(axis=1), 200),
                    }
                    if "betas" in r
                    else {}
                ),
            }
            for label, r in runs.items()
        }
        for size_name, runs in runs_all.items()
    }
    return {
        "experiment": "llm",
        "title": TITLE,
        "config": {
            **cfg,
            "sizes": sizes,
            "device": device,
            "tokens_per_step": cfg["batch_size"] * cfg["context"],
            "precision": "float32",
            "schedule": "cosine to 0, optional linear warm-up over the first 10% of steps",
            "split": "last 10% of tiny-shakespeare bytes held out",
            # the training runs pass neither foreach nor fused: the library's default
            "optimizer_implementation": optimizer_path(
                make_model(next(iter(sizes.values())), cfg["context"], 0).to(device).parameters()
            ),
        },
        "summary": results,
        "claims": _claims(results),
        "curves": curves,
        "plots": plots,
        "wall_time_s": time.perf_counter() - t_start,
    }


def _size_summary(
    name: str,
    size: dict[str, int],
    n_params: int,
    runs: dict[str, Any],
    timing: dict[str, Any],
    cfg: dict[str, Any],
) -> dict[str, Any]:
    table = {}
    for label, r in runs.items():
        e = {
            "optimizer": r["optimizer"],
            "beta_max": r["beta_max"],
            "warmup_steps": r["warmup_steps"],
            "variant": r["variant"],
            "final_val_loss": r["final_val_loss"],
            "min_val_loss": r["min_val_loss"],
            "final_train_loss_avg10": float(np.mean(r["train_loss"][-10:])),
            "diverged": r["diverged"],
            "mean_iter_ms": 1e3 * r["mean_iter_s"],
            "mean_step_ms": 1e3 * r["mean_step_s"],
        }
        if "betas" in r:
            b = r["betas"]
            e["beta_mean"] = float(b.mean())
            e["beta_first10_mean"] = float(b[: max(len(b) // 10, 1)].mean())
            e["frac_beta_below_0.1"] = float(np.mean(b < 0.1))
            e["beta_mean_per_tensor"] = {
                n: float(v) for n, v in zip(r["param_names"], b.mean(axis=0), strict=True)
            }
        table[label] = e
    speedup = {}
    for am, base in (
        ("AM-AdamW (warm-up)", "AdamW (warm-up)"),
        ("AM-AdamW (no warm-up)", "AdamW (warm-up)"),
    ):
        target = runs[base]["final_val_loss"]
        if target is None:
            continue
        s_am = _steps_to(runs[am]["val"], target)
        s_base = _steps_to(runs[base]["val"], target)
        speedup[f"{am} vs {base}"] = {
            "target_val_loss": target,
            "steps_am": s_am,
            "steps_base": s_base,
            "speedup": None if s_am is None or s_base is None or s_am == 0 else s_base / s_am,
        }
    return {
        "size": name,
        "config": size,
        "n_params": n_params,
        "runs": table,
        "timing": timing,
        "speedup": speedup,
    }


def _seed_summary(finals: dict[str, list[float | None]], seed0: int) -> dict[str, Any]:
    """Final validation loss of the repeated runs: per seed, mean, std, paired AM wins."""
    out: dict[str, Any] = {"seeds": [seed0 + k for k in range(len(finals[MAIN_RUNS[0]]))]}
    for label, values in finals.items():
        ok = [v for v in values if v is not None]
        out[label] = {
            "final_val_per_seed": values,
            "mean": float(np.mean(ok)) if ok else None,
            "std": float(np.std(ok, ddof=1)) if len(ok) > 1 else None,
        }

    def wins(a: str, b: str, strict: bool = True) -> int:
        pairs = zip(finals[a], finals[b], strict=True)
        return sum(
            x is not None and (y is None or (x < y if strict else x <= y)) for x, y in pairs
        )

    n = len(out["seeds"])
    out["paired"] = {
        "AM (warm-up) < AdamW (warm-up)": [wins("AM-AdamW (warm-up)", "AdamW (warm-up)"), n],
        "AM (no warm-up) <= AdamW (warm-up)": [
            wins("AM-AdamW (no warm-up)", "AdamW (warm-up)", strict=False),
            n,
        ],
        "AdamW (warm-up) < AdamW (no warm-up)": [wins("AdamW (warm-up)", "AdamW (no warm-up)"), n],
    }
    return out


def _claims(results: dict[str, Any]) -> list[dict[str, Any]]:
    claims = []

    def val(s: dict[str, Any], label: str) -> float:
        v = s["runs"][label]["final_val_loss"]
        return math.inf if v is None else v

    def mean(s: dict[str, Any], label: str) -> float:
        m = s["seeds"][label]["mean"]
        return math.inf if m is None else m

    def paired(
        claim: str, key: str, describe: Callable[[str, dict[str, Any]], str], note: str = ""
    ) -> None:
        """A claim on the seeds paired as ``key``; ``describe(size, summary)`` opens each
        size's part, which ends with the count of seeds where it held."""
        hits = [s["seeds"]["paired"][key] for s in results.values()]
        parts = [
            f"{describe(k, s)} {won}/{n_seeds} seeds"
            for (k, s), (won, n_seeds) in zip(results.items(), hits, strict=True)
        ]
        claims.append(
            {
                "claim": claim,
                "measured": "; ".join(parts) + note,
                "verdict": claim_verdict(sum(w for w, _ in hits), sum(t for _, t in hits)),
            }
        )

    paired(
        "Sec. 4.3: AM-AdamW beats AdamW at every scale (validation loss)",
        "AM (warm-up) < AdamW (warm-up)",
        lambda k, s: (
            f"{k}: {mean(s, 'AM-AdamW (warm-up)'):.4f} vs "
            f"{mean(s, 'AdamW (warm-up)'):.4f}, AM lower in"
        ),
        " (seed means of the final validation loss, AM-AdamW vs AdamW, both with warm-up)",
    )
    paired(
        "Sec. 4.3: AM-AdamW without warm-up matches AdamW with warm-up",
        "AM (no warm-up) <= AdamW (warm-up)",
        lambda k, s: (
            f"{k}: {mean(s, 'AM-AdamW (no warm-up)'):.4f} vs "
            f"{mean(s, 'AdamW (warm-up)'):.4f} (AdamW without warm-up: "
            f"{mean(s, 'AdamW (no warm-up)'):.4f}), AM no-warm-up at or below in"
        ),
    )
    paired(
        "Sec. 4.3: AdamW struggles without warm-up",
        "AdamW (warm-up) < AdamW (no warm-up)",
        lambda k, s: (
            f"{k}: no warm-up {mean(s, 'AdamW (no warm-up)'):.4f} vs warm-up "
            f"{mean(s, 'AdamW (warm-up)'):.4f}, warm-up better in"
        ),
    )

    def tally(claim: str, checks: list[tuple[str, bool]], note: str = "") -> None:
        """A claim checked once per entry of ``checks``: (what was measured, whether it held)."""
        claims.append(
            {
                "claim": claim,
                "measured": "; ".join(text for text, _ in checks) + note,
                "verdict": claim_verdict(sum(held for _, held in checks), len(checks)),
            }
        )

    checks = []
    for k, s in results.items():
        for label in s["runs"]:
            if label.startswith("AM-AdamW beta_max="):
                bm = label.split("=")[1]
                a, b = val(s, label), val(s, f"AdamW beta1={bm}")
                checks.append((f"{k} beta_max={bm}: {a:.4f} vs {b:.4f}", a < b))
    if checks:
        tally("Table 2: at beta_max 0.95 / 0.99 AM-AdamW is much better than AdamW", checks)
    checks = []
    for k, s in results.items():
        am, aw = val(s, "AM-AdamW (warm-up)"), val(s, "AdamW (warm-up)")
        cl, rs = val(s, "AM-AdamW (clip)"), val(s, "AM-AdamW (restart)")
        text = f"{k}: AdamW {aw:.4f}, AM {am:.4f}, clip {cl:.4f}, restart {rs:.4f}"
        checks.append((text, am <= rs <= cl <= aw))
    tally("Table 1: AM-AdamW < restart < clip < AdamW (validation loss)", checks)
    checks = []
    for k, s in results.items():
        t = s["timing"]
        shares = {
            impl: t[f"overhead {impl}"] for impl in IMPLEMENTATIONS if f"overhead {impl}" in t
        }
        text = f"{k}: " + ", ".join(
            f"{impl} {o['iter_pct']:+.1f}% (step() difference {o['step_diff_pct_of_iter']:+.2f}%)"
            for impl, o in shares.items()
        )
        best = min((o["step_diff_pct_of_iter"] for o in shares.values()), default=np.inf)
        checks.append((text, best < 0.5))
    tally(
        "Supp. D: AM-AdamW adds < 0.5% to an iteration",
        checks,
        " of AdamW's iteration time, per implementation (AdamW and AM-AdamW with the "
        "same flags); verdict on the best implementation's step() difference",
    )
    parts = []
    for k, s in results.items():
        sp = s["speedup"].get("AM-AdamW (warm-up) vs AdamW (warm-up)")
        if sp:
            parts.append(f"{k}: {sp['speedup']:.2f}x" if sp["speedup"] else f"{k}: not reached")
    claims.append(
        {
            "claim": "Supp. D: AM-AdamW reaches AdamW's final validation loss 1.1-1.5x sooner",
            "measured": "steps ratio (AdamW / AM-AdamW, with warm-up): " + "; ".join(parts),
            "verdict": "see table",
        }
    )
    return claims


def _plot_val(ctx: RunContext, runs_all: dict[str, dict[str, Any]], cfg: dict[str, Any]) -> str:
    plt = pyplot()
    sizes = list(runs_all)
    fig, axes = plt.subplots(2, len(sizes), figsize=(5.2 * len(sizes), 7.4), squeeze=False)
    bm_colors = ["tab:purple", "tab:brown", "tab:olive"]
    for j, size in enumerate(sizes):
        runs = runs_all[size]
        for row, labels in enumerate(
            (
                [k for k in runs if "beta" not in k and "clip" not in k and "restart" not in k],
                ["AdamW (warm-up)", "AM-AdamW (warm-up)", "AM-AdamW (clip)", "AM-AdamW (restart)"]
                + [k for k in runs if "beta" in k],
            )
        ):
            ax = axes[row, j]
            for label in labels:
                r = runs[label]
                if label in STYLES:
                    color, ls = STYLES[label]
                else:
                    bm = float(label.split("=")[1])
                    color = bm_colors[cfg["beta_maxes"].index(bm) % len(bm_colors)]
                    ls = "-" if label.startswith("AM") else ":"
                s, v = zip(*r["val"], strict=True)
                ax.plot(s, v, color=color, ls=ls, marker="o", ms=2.5, lw=1.2, label=label)
            ax.set_xlabel("step")
            ax.set_ylabel("validation loss (nats / byte)")
            finals = [runs[k]["final_val_loss"] for k in labels if runs[k]["final_val_loss"]]
            if finals:
                lo = min(finals)
                ax.set_ylim(lo - 0.1, lo + 1.2)
            ax.set_title(
                f"{size}: " + ("warm-up vs no warm-up" if row == 0 else "beta_max and variants")
            )
            ax.legend(loc="upper right")
    fig.suptitle(
        f"{TITLE}\n{cfg['steps']} steps x {cfg['batch_size']} x {cfg['context']} bytes, "
        f"lr {cfg['lr']}, cosine schedule, clip {cfg['grad_clip']}",
        fontsize=10,
    )
    return save_figure(fig, ctx.out / "llm.png")


def _plot_betas(ctx: RunContext, runs_all: dict[str, dict[str, Any]]) -> str:
    plt = pyplot()
    sizes = list(runs_all)
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.2 * len(sizes), 3.6), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        for label, color in (("AM-AdamW (warm-up)", "tab:red"), ("AM-AdamW (no warm-up)", "k")):
            r = runs_all[size][label]
            b = r["betas"]
            steps = np.arange(1, b.shape[0] + 1)
            ax.fill_between(steps, b.min(axis=1), b.max(axis=1), color=color, alpha=0.12, lw=0)
            ax.plot(
                steps,
                np.median(b, axis=1),
                color=color,
                lw=1.0,
                label=f"{label}: median over tensors (band: min-max)",
            )
        ax.set_ylim(-0.02, 1.0)
        ax.set_xlabel("step")
        ax.set_ylabel("per-tensor beta_1,t")
        ax.set_title(f"{size}: layer-wise beta_t")
        ax.legend(loc="lower right", fontsize=6.5)
    fig.suptitle("AM-AdamW per-tensor momentum coefficients (beta_max = 0.9)", fontsize=10)
    return save_figure(fig, ctx.out / "llm_betas.png")


def summary_markdown(result: dict[str, Any]) -> str:
    """Markdown tables of the LLM experiment."""
    cfg = result["config"]
    blocks: list[Any] = [
        f"{cfg['steps']} steps of {cfg['batch_size']} x {cfg['context']} bytes "
        f"({cfg['tokens_per_step']} tokens/step), lr {cfg['lr']}, weight decay "
        f"{cfg['weight_decay']}, betas (beta_max, {cfg['beta2']}), eps {cfg['eps']}, clip "
        f"{cfg['grad_clip']}, {cfg['schedule']}, AM-AdamW lam {cfg['lam']} per-tensor beta, "
        f"{cfg['precision']}, device {cfg['device']}, one seed; validation on "
        f"{cfg['eval_batches'] * cfg['batch_size']} fixed held-out windows "
        f"({cfg['split']}). " + implementation_note(cfg, "AM-AdamW")
    ]
    for size, s in result["summary"].items():
        c = s["config"]
        blocks.append(
            f"### {size} ({s['n_params']:,} parameters: hidden {c['hidden_size']}, "
            f"{c['num_hidden_layers']} layers, {c['num_attention_heads']} heads, "
            f"MLP {c['intermediate_size']})"
        )
        rows = []
        best = min(
            (e["final_val_loss"] for e in s["runs"].values() if e["final_val_loss"] is not None),
            default=None,
        )
        for label, e in s["runs"].items():
            v = e["final_val_loss"]
            cell = "diverged" if v is None else f"{v:.4f}"
            if v is not None and v == best:
                cell = f"**{cell}**"
            rows.append(
                [
                    label,
                    cell,
                    e["min_val_loss"],
                    e["final_train_loss_avg10"],
                    e.get("beta_mean"),
                    e.get("frac_beta_below_0.1"),
                    e["mean_iter_ms"],
                ]
            )
        blocks.append(
            (
                [
                    "run",
                    "final val loss",
                    "min val loss",
                    "train loss (last 10)",
                    "mean beta_t",
                    "frac beta_t < 0.1",
                    "ms / iter",
                ],
                rows,
            )
        )
        blocks.append(
            "Per-iteration time (median of rounds, fixed batch; 'step diff / iter' is the "
            "difference of the step() times as a share of AdamW's iteration):"
        )
        t = s["timing"]
        rows = []
        for impl in IMPLEMENTATIONS:
            o = t.get(f"overhead {impl}")
            if o is None:
                continue
            a, b = t[f"AdamW {impl}"], t[f"AM-AdamW {impl}"]
            rows.append(
                [
                    impl,
                    1e3 * a["iter_s"],
                    1e3 * b["iter_s"],
                    f"{o['iter_pct']:+.2f}%",
                    1e3 * a["step_s"],
                    1e3 * b["step_s"],
                    f"{o['step_ratio']:.2f}x",
                    f"{o['step_diff_pct_of_iter']:+.2f}%",
                ]
            )
        blocks.append(
            (
                [
                    "implementation",
                    "AdamW ms/iter",
                    "AM-AdamW ms/iter",
                    "overhead",
                    "AdamW step ms",
                    "AM-AdamW step ms",
                    "step ratio",
                    "step diff / iter",
                ],
                rows,
            )
        )
        blocks += [f"{k} not timed: {why}" for k, why in t.get("unavailable", {}).items()]
        seeds = s.get("seeds")
        if seeds:
            blocks.append(
                f"Final validation loss over seeds {seeds['seeds']} (initialisation and batch "
                "order; the first seed is the run above):"
            )
            blocks.append(
                (
                    ["run", "per seed", "mean", "std"],
                    [
                        [
                            label,
                            ", ".join(
                                "diverged" if v is None else f"{v:.4f}"
                                for v in seeds[label]["final_val_per_seed"]
                            ),
                            "-" if seeds[label]["mean"] is None else f"{seeds[label]['mean']:.4f}",
                            "-" if seeds[label]["std"] is None else f"{seeds[label]['std']:.4f}",
                        ]
                        for label in MAIN_RUNS
                    ],
                )
            )
        if s["speedup"]:
            blocks.append("Steps to reach AdamW (warm-up)'s final validation loss:")
            blocks.append(
                (
                    ["comparison", "target", "steps AM", "steps AdamW", "speedup"],
                    [
                        [k, v["target_val_loss"], v["steps_am"], v["steps_base"], v["speedup"]]
                        for k, v in s["speedup"].items()
                    ],
                )
            )
    return markdown_summary(result, *blocks)
