"""``vision``: MGD vs AMSGD training a small CNN on Fashion-MNIST (paper Sec. 4.2, 4.4).

The paper trains ResNets/VGG on CIFAR for 200 epochs; on a CPU we train a small
CNN (two 3x3 conv layers with 16 and 32 channels, max-pooling, a 64-unit hidden
layer; about 106k parameters) on a fixed random subset of the Fashion-MNIST
training set, pixels scaled to [0, 1] and standardised, no augmentation.

Main comparison (paired: the same initialisation and batch order for both
optimizers of a seed):

* MGD: ``torch.optim.SGD(lr, momentum=0.9, dampening=0.9)`` (the paper's damped baseline),
* AMSGD: :class:`amopt.torch.AMSGD` ``(lr, lam=0.1, beta_max=0.9)`` (one global beta; the
  paper's AM-MGD in its stochastic form). Figures, tables and log lines say "AMSGD";
  ``results.json`` keeps the key ``"AM-MGD"`` for it (results stored earlier read the same),

lr = 0.1, batch size 128, a step schedule (x0.1 at 50% and 75% of the steps, as the
paper's CIFAR-10 schedule at [100, 150] of 200 epochs), no weight decay. Recorded:
train loss and beta_t at every step, test loss / accuracy after every epoch.

Ablations (paper Fig. 5; no schedule, as in the paper, shorter budget): final
test accuracy for lam in {0.01, 0.1, 1} (AM only; beta_max = 0.9, so the cap on
the applied coefficient (beta + lam) / (1 + lam) is (0.9 + lam) / (1 + lam)),
batch size in {32, 128, 512} and lr in {0.05, 0.1, 0.2, 0.5} (both optimizers).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ._common import (
    RunContext,
    claim_verdict,
    implementation_note,
    markdown_summary,
    optimizer_path,
    torch_threads,
)
from ._data import load_fashion_mnist
from ._plots import pyplot, save_figure

__all__ = ["run", "summary_markdown", "make_model"]

TITLE = "Fashion-MNIST small CNN: MGD vs AMSGD (paper Sec. 4.2 / Fig. 5 at small scale)"
#: What each optimizer key of the results is called in figures, tables and log lines.
NAMES = {"MGD": "MGD (SGD, dampening 0.9)", "AM-MGD": "AMSGD"}
MEAN, STD = 0.2860, 0.3530

REAL: dict[str, Any] = {
    "n_train": 20_000,
    "n_test": 10_000,
    "epochs": 6,
    "batch_size": 128,
    "lr": 0.1,
    "lam": 0.1,
    "beta_max": 0.9,
    "milestones": [0.5, 0.75],
    "gamma": 0.1,
    "seeds": 3,
    "ablation": {
        "n_train": 10_000,
        "epochs": 4,
        "seeds": 2,
        "lams": [0.01, 0.1, 1.0],
        "batch_sizes": [32, 128, 512],
        "lrs": [0.05, 0.1, 0.2, 0.5],
    },
}
QUICK: dict[str, Any] = {
    **REAL,
    "n_train": 1024,
    "n_test": 1000,
    "epochs": 1,
    "seeds": 1,
    "ablation": {
        "n_train": 512,
        "epochs": 1,
        "seeds": 1,
        "lams": [0.1, 1.0],
        "batch_sizes": [64, 128],
        "lrs": [0.1, 0.5],
    },
}


def make_model() -> Any:
    """The small CNN (about 106k parameters) used by the experiment.

    Examples
    --------
    >>> import torch
    >>> model = make_model()
    >>> tuple(model(torch.zeros(2, 1, 28, 28)).shape), sum(p.numel() for p in model.parameters())
    ((2, 10), 105866)
    """
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def _tensors(x: np.ndarray, y: np.ndarray, device: str) -> tuple[Any, Any]:
    import torch

    xt = torch.from_numpy(((x.astype(np.float32) / 255.0) - MEAN) / STD).unsqueeze(1)
    return xt.to(device), torch.from_numpy(y.astype(np.int64)).to(device)


def _evaluate(model: Any, x: Any, y: Any, batch: int = 2000) -> tuple[float, float]:
    import torch
    import torch.nn.functional as F

    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            out = model(x[i : i + batch])
            loss += float(F.cross_entropy(out, y[i : i + batch], reduction="sum"))
            correct += int((out.argmax(1) == y[i : i + batch]).sum())
    model.train()
    return loss / x.shape[0], correct / x.shape[0]


def _train(
    ctx: RunContext,
    data: dict[str, Any],
    *,
    optimizer: str,
    seed: int,
    lr: float,
    lam: float,
    beta_max: float,
    batch_size: int,
    epochs: int,
    schedule: list[float] | None,
    gamma: float,
    n_train: int,
    desc: str,
) -> dict[str, Any]:
    """One training run; returns per-step and per-epoch records."""
    import torch
    import torch.nn.functional as F

    from amopt.torch import AMSGD

    x_train, y_train = data["x_train"][:n_train], data["y_train"][:n_train]
    torch.manual_seed(seed)
    model = make_model().to(x_train.device)
    if optimizer == "MGD":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, dampening=0.9)
    else:
        opt = AMSGD(model.parameters(), lr=lr, lam=lam, beta_max=beta_max)
    steps_per_epoch = (n_train + batch_size - 1) // batch_size
    total = steps_per_epoch * epochs
    sched = None
    if schedule:
        milestones = [int(round(m * total)) for m in schedule]
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=gamma)
    gen = torch.Generator().manual_seed(seed)
    losses, betas = [], []
    test_loss, test_acc = _evaluate(model, data["x_test"], data["y_test"])
    epochs_rec = [{"epoch": 0, "step": 0, "test_loss": test_loss, "test_acc": test_acc}]
    t0 = time.perf_counter()
    bar = ctx.progress(total=total, desc=desc, unit="step")
    diverged = False
    for epoch in range(1, epochs + 1):
        perm = torch.randperm(n_train, generator=gen).to(x_train.device)
        epoch_losses = []
        for i in range(0, n_train, batch_size):
            idx = perm[i : i + batch_size]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            value = loss.item()
            losses.append(value)
            epoch_losses.append(value)
            if optimizer != "MGD":
                betas.append(float(opt.latest_betas()[0][0]))
            bar.update(1)
            if not np.isfinite(value):
                diverged = True
                break
        if diverged:
            break
        test_loss, test_acc = _evaluate(model, data["x_test"], data["y_test"])
        epochs_rec.append(
            {
                "epoch": epoch,
                "step": len(losses),
                "train_loss": float(np.mean(epoch_losses)),
                "test_loss": test_loss,
                "test_acc": test_acc,
            }
        )
    bar.close()
    seconds = time.perf_counter() - t0
    return {
        "optimizer": optimizer,
        "seed": seed,
        "lr": lr,
        "lam": lam if optimizer != "MGD" else None,
        "batch_size": batch_size,
        "losses": np.asarray(losses),
        "betas": np.asarray(betas) if betas else None,
        "epochs": epochs_rec,
        "final_test_acc": epochs_rec[-1]["test_acc"] if not diverged else None,
        "final_train_loss": epochs_rec[-1].get("train_loss") if not diverged else None,
        "diverged": diverged,
        "seconds": seconds,
    }


def _beta_phases(betas: np.ndarray) -> dict[str, Any]:
    """beta_t statistics over the first 10%, the middle and the last 25% of training."""
    n = betas.size
    parts = {
        "first 10%": betas[: max(n // 10, 1)],
        "middle": betas[n // 10 : (3 * n) // 4],
        "last 25%": betas[(3 * n) // 4 :],
    }
    return {
        k: {
            "mean": float(np.mean(v)) if v.size else None,
            "frac_below_0.1": float(np.mean(v < 0.1)) if v.size else None,
            "frac_at_cap": float(np.mean(v >= 0.9 - 1e-6)) if v.size else None,
        }
        for k, v in parts.items()
    }


def run(ctx: RunContext) -> dict[str, Any]:
    """Run the experiment with ``ctx.threads`` torch threads (see the module docstring)."""
    with torch_threads(ctx.threads):
        return _run(ctx)


def _run(ctx: RunContext) -> dict[str, Any]:
    """Run the vision experiment (see the module docstring)."""
    cfg = QUICK if ctx.quick else REAL
    abl = cfg["ablation"]
    t_start = time.perf_counter()
    device = ctx.torch_device()
    x_tr, y_tr, x_te, y_te = load_fashion_mnist(ctx.data_dir)
    rng = np.random.default_rng(ctx.seed)
    n_sub = max(cfg["n_train"], abl["n_train"])
    sub = rng.permutation(x_tr.shape[0])[:n_sub]
    test_sub = np.arange(x_te.shape[0])[: cfg["n_test"]]
    xt, yt = _tensors(x_tr[sub], y_tr[sub], device)
    xv, yv = _tensors(x_te[test_sub], y_te[test_sub], device)
    data = {"x_train": xt, "y_train": yt, "x_test": xv, "y_test": yv}
    ctx.log(f"[vision] train subset {n_sub} of {x_tr.shape[0]}, test {xv.shape[0]}, on {device}")

    main_runs: list[dict[str, Any]] = []
    for k in range(cfg["seeds"]):
        for opt in ("MGD", "AM-MGD"):
            r = _train(
                ctx,
                data,
                optimizer=opt,
                seed=ctx.seed + k,
                lr=cfg["lr"],
                lam=cfg["lam"],
                beta_max=cfg["beta_max"],
                batch_size=cfg["batch_size"],
                epochs=cfg["epochs"],
                schedule=cfg["milestones"],
                gamma=cfg["gamma"],
                n_train=cfg["n_train"],
                desc=f"vision {opt} seed {ctx.seed + k}",
            )
            main_runs.append(r)
            ctx.log(
                f"[vision] main {NAMES[opt]} seed {ctx.seed + k}: test accuracy "
                f"{_num(r['final_test_acc'])}, last-epoch train loss "
                f"{_num(r['final_train_loss'])}, {r['seconds']:.0f} s"
            )

    configs = []
    base = {"lr": cfg["lr"], "lam": cfg["lam"], "batch_size": cfg["batch_size"]}
    for lam in abl["lams"]:
        configs.append(("lam", lam, "AM-MGD", {**base, "lam": lam}))
    configs.append(("lam", None, "MGD", dict(base)))
    for bs in abl["batch_sizes"]:
        for opt in ("MGD", "AM-MGD"):
            configs.append(("batch_size", bs, opt, {**base, "batch_size": bs}))
    for lr in abl["lrs"]:
        for opt in ("MGD", "AM-MGD"):
            configs.append(("lr", lr, opt, {**base, "lr": lr}))
    cache: dict[tuple, dict[str, Any]] = {}
    ablation = []
    for param, value, opt, hp in configs:
        accs = []
        for k in range(abl["seeds"]):
            key = (opt, hp["lr"], hp["lam"] if opt != "MGD" else None, hp["batch_size"], k)
            if key not in cache:
                cache[key] = _train(
                    ctx,
                    data,
                    optimizer=opt,
                    seed=ctx.seed + 100 + k,
                    lr=hp["lr"],
                    lam=hp["lam"],
                    beta_max=cfg["beta_max"],
                    batch_size=hp["batch_size"],
                    epochs=abl["epochs"],
                    schedule=None,
                    gamma=1.0,
                    n_train=abl["n_train"],
                    desc=f"ablation {param}={value} {opt}",
                )
            accs.append(cache[key]["final_test_acc"])
        ok = [a for a in accs if a is not None]
        entry = {
            "param": param,
            "value": value,
            "optimizer": opt,
            **hp,
            "test_acc_per_seed": accs,
            "test_acc_mean": float(np.mean(ok)) if ok else None,
            "diverged_seeds": len(accs) - len(ok),
        }
        if opt != "MGD":
            entry["coefficient_cap"] = (cfg["beta_max"] + hp["lam"]) / (1 + hp["lam"])
        ablation.append(entry)
        ctx.log(
            f"[vision] ablation {param} = {value} {NAMES[opt]}: test accuracy "
            + ", ".join("diverged" if a is None else _num(a) for a in accs)
            + (f" ({len(accs)} seeds)" if len(accs) > 1 else "")
        )

    summary = _summarise(main_runs, ablation, cfg)
    plots = [_plot_main(ctx, main_runs, cfg), _plot_ablation(ctx, ablation, abl)]
    curves = {
        f"{r['optimizer']} seed {r['seed']}": {
            "train_loss": ctx.curve(r["losses"], 400),
            **({"beta": ctx.curve(r["betas"], 400)} if r["betas"] is not None else {}),
            "epochs": r["epochs"],
        }
        for r in main_runs
    }
    return {
        "experiment": "vision",
        "title": TITLE,
        "config": {
            **cfg,
            "device": device,
            "model": "conv16-pool-conv32-pool-fc64-fc10 (105,866 parameters)",
            "augmentation": None,
            "weight_decay": 0.0,
            "mgd": "torch.optim.SGD(momentum=0.9, dampening=0.9)",
            "am": "amopt.torch.AMSGD(lam, beta_max=0.9), global beta",
            # AMSGD is built without foreach/fused: the library's default implementation
            "optimizer_implementation": optimizer_path(make_model().to(device).parameters()),
        },
        "summary": summary,
        "claims": _claims(summary),
        "curves": curves,
        "plots": plots,
        "wall_time_s": time.perf_counter() - t_start,
    }


def _summarise(
    main_runs: list[dict[str, Any]], ablation: list[dict[str, Any]], cfg: dict[str, Any]
) -> dict[str, Any]:
    per_opt: dict[str, Any] = {}
    for opt in ("MGD", "AM-MGD"):
        rs = [r for r in main_runs if r["optimizer"] == opt]
        accs = [r["final_test_acc"] for r in rs if r["final_test_acc"] is not None]
        losses = [r["final_train_loss"] for r in rs if r["final_train_loss"] is not None]
        per_opt[opt] = {
            "test_acc_per_seed": [r["final_test_acc"] for r in rs],
            "test_acc_mean": float(np.mean(accs)) if accs else None,
            "test_acc_std": float(np.std(accs, ddof=1)) if len(accs) > 1 else None,
            "train_loss_per_seed": [r["final_train_loss"] for r in rs],
            "train_loss_mean": float(np.mean(losses)) if losses else None,
            "test_acc_by_epoch_mean": [
                float(np.mean([r["epochs"][e]["test_acc"] for r in rs]))
                for e in range(min(len(r["epochs"]) for r in rs))
            ],
            "seconds_mean": float(np.mean([r["seconds"] for r in rs])),
        }
    seeds = sorted({r["seed"] for r in main_runs})
    paired = []
    for s in seeds:
        a = next(r for r in main_runs if r["seed"] == s and r["optimizer"] == "AM-MGD")
        m = next(r for r in main_runs if r["seed"] == s and r["optimizer"] == "MGD")
        paired.append(
            {
                "seed": s,
                "acc_diff": None
                if a["final_test_acc"] is None or m["final_test_acc"] is None
                else a["final_test_acc"] - m["final_test_acc"],
                "train_loss_diff": None
                if a["final_train_loss"] is None or m["final_train_loss"] is None
                else a["final_train_loss"] - m["final_train_loss"],
            }
        )
    am_betas = [r["betas"] for r in main_runs if r["betas"] is not None]
    phases = _beta_phases(am_betas[0]) if am_betas else {}
    return {
        "main": per_opt,
        "paired": paired,
        "beta_phases_first_seed": phases,
        "beta_mean": float(np.mean(np.concatenate(am_betas))) if am_betas else None,
        "ablation": ablation,
    }


def _claims(summary: dict[str, Any]) -> list[dict[str, Any]]:
    claims = []
    diffs = [p["acc_diff"] for p in summary["paired"] if p["acc_diff"] is not None]
    wins = sum(d > 0 for d in diffs)
    m, a = summary["main"]["MGD"], summary["main"]["AM-MGD"]
    claims.append(
        {
            "claim": "Sec. 4.2: AM-MGD (AMSGD) outperforms MGD (test accuracy)",
            "measured": f"test accuracy {a['test_acc_mean']:.4f} (AM) vs {m['test_acc_mean']:.4f} "
            f"(MGD), seed means; AM higher in {wins}/{len(diffs)} paired seeds "
            f"(differences {', '.join(f'{d:+.4f}' for d in diffs)})",
            "verdict": claim_verdict(wins, len(diffs)),
        }
    )
    ldiffs = [p["train_loss_diff"] for p in summary["paired"] if p["train_loss_diff"] is not None]
    lw = sum(d < 0 for d in ldiffs)
    claims.append(
        {
            "claim": "Sec. 4.2: AM-MGD (AMSGD) optimises faster (train loss)",
            "measured": f"last-epoch train loss {a['train_loss_mean']:.4f} (AM) vs "
            f"{m['train_loss_mean']:.4f} (MGD); AM lower in {lw}/{len(ldiffs)} seeds",
            "verdict": claim_verdict(lw, len(ldiffs)),
        }
    )
    ph = summary["beta_phases_first_seed"]
    if ph:
        claims.append(
            {
                "claim": "Sec. 4.2: beta_t has three phases (small early, high in the middle, "
                "sharp drops near interpolation)",
                "measured": "mean beta_t first 10% / middle / last 25%: "
                + " / ".join(f"{v['mean']:.2f}" for v in ph.values())
                + "; fraction of steps with beta_t < 0.1: "
                + " / ".join(f"{v['frac_below_0.1']:.2f}" for v in ph.values()),
                "verdict": "see plot",
            }
        )
    abl = summary["ablation"]
    claims.append(
        _ablation_claim(abl, "lr", "Fig. 5c: AM-MGD's gains persist across learning rates", "lr")
    )
    claims.append(
        _ablation_claim(
            abl,
            "batch_size",
            "Fig. 5b: small batches do not hurt AM's relative gain",
            "batch size",
        )
    )
    lam_rows = [e for e in abl if e["param"] == "lam" and e["optimizer"] == "AM-MGD"]
    accs = [e["test_acc_mean"] for e in lam_rows if e["test_acc_mean"] is not None]
    if accs:
        spread = max(accs) - min(accs)
        claims.append(
            {
                "claim": "Fig. 5a: lam in [0.01, 1] gives comparable results",
                "measured": f"AM final test accuracy over lam {[e['value'] for e in lam_rows]}: "
                + ", ".join(f"{x:.4f}" for x in accs)
                + f" (spread {spread:.4f})",
                "verdict": "see table",
            }
        )
    return claims


def _ablation_claim(
    ablation: list[dict[str, Any]], param: str, claim: str, name: str
) -> dict[str, Any]:
    """AM-MGD against MGD at each value of the ablated ``param`` (final test accuracy)."""
    rows = [e for e in ablation if e["param"] == param]
    values = sorted({e["value"] for e in rows})
    better = []
    for value in values:
        am = next(e for e in rows if e["value"] == value and e["optimizer"] == "AM-MGD")
        mgd = next(e for e in rows if e["value"] == value and e["optimizer"] == "MGD")
        if am["test_acc_mean"] is not None and (
            mgd["test_acc_mean"] is None or am["test_acc_mean"] > mgd["test_acc_mean"]
        ):
            better.append(value)
    return {
        "claim": claim,
        "measured": f"AM higher final test accuracy at {name} in {better} of {values}",
        "verdict": claim_verdict(len(better), len(values)),
    }


def _num(value: Any) -> str:
    """A metric for a log line: 4 significant digits, or "diverged" for None/NaN."""
    if value is None or not np.isfinite(value):
        return "diverged"
    return f"{float(value):.4g}"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _smooth(y: np.ndarray, w: int) -> np.ndarray:
    if y.size < w or w <= 1:
        return y
    return np.convolve(y, np.ones(w) / w, mode="valid")


def _plot_main(ctx: RunContext, runs: list[dict[str, Any]], cfg: dict[str, Any]) -> str:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.9))
    colors = {"MGD": "tab:blue", "AM-MGD": "tab:red"}
    seeds = sorted({r["seed"] for r in runs})
    for r in runs:
        c = colors[r["optimizer"]]
        first = r["seed"] == seeds[0]
        w = max(len(r["losses"]) // 50, 1)
        y = _smooth(r["losses"], w)
        axes[0].plot(
            np.arange(y.size) + w,
            y,
            color=c,
            lw=1.0,
            alpha=1.0 if first else 0.35,
            label=NAMES[r["optimizer"]] if first else None,
        )
        ep = r["epochs"]
        axes[1].plot(
            [e["epoch"] for e in ep[1:]],
            [e["test_acc"] for e in ep[1:]],
            color=c,
            marker="o",
            ms=3,
            lw=1.0,
            alpha=1.0 if first else 0.35,
            label=NAMES[r["optimizer"]] if first else None,
        )
    axes[0].set_yscale("log")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel(f"train loss (moving average over {w} steps)")
    axes[0].set_title("train loss (all seeds; bold: first seed)")
    axes[0].legend()
    axes[1].set_xlabel("epoch")
    axes[1].set_ylabel("test accuracy")
    axes[1].set_title("test accuracy")
    axes[1].legend()
    am = next((r for r in runs if r["betas"] is not None), None)
    if am is not None:
        axes[2].plot(
            np.arange(1, am["betas"].size + 1),
            am["betas"],
            color="tab:red",
            lw=0.4,
            label=f"AMSGD beta_t (seed {am['seed']})",
        )
        w = max(am["betas"].size // 40, 1)
        ys = _smooth(am["betas"], w)
        axes[2].plot(np.arange(ys.size) + w, ys, color="k", lw=1.2, label=f"moving average ({w})")
    axes[2].axhline(0.9, color="tab:blue", ls="--", lw=1.0, label="MGD beta = 0.9")
    total = len(runs[0]["losses"])
    for m in cfg["milestones"]:
        for ax in (axes[0], axes[2]):
            ax.axvline(m * total, color="gray", ls=":", lw=0.8)
    axes[2].set_ylim(-0.02, 1.0)
    axes[2].set_xlabel("step")
    axes[2].set_ylabel("beta_t")
    axes[2].set_title("momentum coefficient (dotted: lr drops)")
    axes[2].legend(loc="lower right")
    fig.suptitle(
        f"{TITLE}\n{cfg['n_train']} training images, batch {cfg['batch_size']}, lr {cfg['lr']}, "
        f"{_count(cfg['epochs'], 'epoch')}, {_count(len(seeds), 'seed')}",
        fontsize=10,
    )
    return save_figure(fig, ctx.out / "vision.png")


def _plot_ablation(ctx: RunContext, ablation: list[dict[str, Any]], abl: dict[str, Any]) -> str:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    colors = {"MGD": "tab:blue", "AM-MGD": "tab:red"}
    for ax, param, label in zip(
        axes, ("lam", "batch_size", "lr"), ("lambda", "batch size", "learning rate"), strict=True
    ):
        rows = [e for e in ablation if e["param"] == param]
        for opt in ("MGD", "AM-MGD"):
            sel = [e for e in rows if e["optimizer"] == opt]
            if not sel:
                continue
            if param == "lam" and opt == "MGD":
                acc = sel[0]["test_acc_mean"]
                if acc is not None:
                    ax.axhline(acc, color=colors[opt], ls="--", label=f"{NAMES[opt]}, no lambda")
                continue
            xs = [e["value"] for e in sel]
            ys = [np.nan if e["test_acc_mean"] is None else e["test_acc_mean"] for e in sel]
            ax.plot(xs, ys, color=colors[opt], marker="o", label=NAMES[opt])
            for e in sel:
                for a in e["test_acc_per_seed"]:
                    if a is not None:
                        ax.scatter([e["value"]], [a], color=colors[opt], s=8, alpha=0.4)
        ax.set_xscale("log")
        values = sorted({e["value"] for e in rows if e["value"] is not None})
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.minorticks_off()
        ax.set_xlabel(label)
        ax.set_ylabel("final test accuracy")
        ax.legend()
    fig.suptitle(
        f"Ablations (no schedule, {abl['n_train']} images, {_count(abl['epochs'], 'epoch')}, "
        f"{_count(abl['seeds'], 'seed')}; dots: seeds, line: mean)",
        fontsize=10,
    )
    return save_figure(fig, ctx.out / "vision_ablation.png")


def summary_markdown(result: dict[str, Any]) -> str:
    """Markdown tables of the vision experiment."""
    cfg = result["config"]
    s = result["summary"]
    rows = []
    for opt in ("MGD", "AM-MGD"):
        m = s["main"][opt]
        rows.append(
            [
                NAMES[opt],
                ", ".join("-" if a is None else f"{a:.4f}" for a in m["test_acc_per_seed"]),
                m["test_acc_mean"],
                m["test_acc_std"],
                ", ".join("-" if a is None else f"{a:.4f}" for a in m["train_loss_per_seed"]),
                m["seconds_mean"],
            ]
        )
    blocks: list[Any] = [
        f"Model: {cfg['model']}; {cfg['n_train']} training images (fixed random subset), "
        f"{cfg['n_test']} test images, batch {cfg['batch_size']}, lr {cfg['lr']}, x{cfg['gamma']} "
        f"at {cfg['milestones']} of the steps, {cfg['epochs']} epochs, no weight decay, no "
        f"augmentation, device {cfg['device']}. MGD = {cfg['mgd']}; AMSGD = {cfg['am']}, "
        f"lam = {cfg['lam']}. " + implementation_note(cfg, "AMSGD"),
        (
            [
                "optimizer",
                "test acc per seed",
                "mean",
                "std",
                "last-epoch train loss per seed",
                "seconds per run",
            ],
            rows,
        ),
    ]
    if s["beta_phases_first_seed"]:
        blocks.append(f"AMSGD beta_t (first seed; mean over all seeds {s['beta_mean']:.3f}):")
        blocks.append(
            (
                ["phase", "mean beta_t", "fraction < 0.1", "fraction at 0.9"],
                [
                    [k, v["mean"], v["frac_below_0.1"], v["frac_at_cap"]]
                    for k, v in s["beta_phases_first_seed"].items()
                ],
            )
        )
    abl = cfg["ablation"]
    rows = []
    for e in s["ablation"]:
        rows.append(
            [
                e["param"],
                "-" if e["value"] is None else str(e["value"]),
                NAMES[e["optimizer"]],
                e["test_acc_mean"],
                ", ".join("diverged" if a is None else f"{a:.4f}" for a in e["test_acc_per_seed"]),
                e.get("coefficient_cap"),
            ]
        )
    blocks.append(
        f"Ablations: no schedule, {abl['n_train']} training images, {abl['epochs']} epochs, "
        f"{abl['seeds']} seeds (mean final test accuracy; other parameters as above)."
    )
    blocks.append(
        (
            [
                "varied",
                "value",
                "optimizer",
                "mean test acc",
                "per seed",
                "cap (beta+lam)/(1+lam)",
            ],
            rows,
        )
    )
    # the title of results stored before the optimizer was named AMSGD in the figures
    return markdown_summary({**result, "title": TITLE}, *blocks)
