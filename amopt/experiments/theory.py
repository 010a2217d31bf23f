"""``theory``: the convergence theorems of simplified AM-SGD, measured against their bounds.

Runs :func:`amopt.problems.check_theorem_3_1`, :func:`~amopt.problems.check_theorem_3_2`
and :func:`~amopt.problems.check_fixed_cap` (batch size 1, seeds averaged) for T in
{10^2, 10^3, 10^4} on problems whose constants are certified:

* Theorem 3.1 (convex, weighted average iterate, lr = 1/sqrt(T), beta_max = 1/T) and the
  fixed-cap theorem (beta_max = 0.9, lr = 1/sqrt(T)): planted Huber regression with
  noise (sigma_f^2 > 0), planted Huber regression without noise (interpolation,
  sigma_f^2 = 0), logistic regression on a1a (real data, l2 = 0);
* Theorem 3.2 (L-smooth, lr = 1/sqrt(T), beta_max = c lr, c = 0.5): the non-convex
  regularised logistic regression and logistic regression on a1a.

A measured value above its bound would be a bug (or a wrong constant); it is
reported as failed, never loosened.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ._common import RunContext, markdown_summary
from ._plots import figure_legend, pyplot, save_figure

__all__ = ["run", "summary_markdown"]

TITLE = "Convergence theorems of simplified AM-SGD: measured vs bound"

REAL = {"Ts": [100, 1000, 10_000], "seeds": 10, "batch_size": 1, "c": 0.5, "beta_max_cap": 0.9}
QUICK = {"Ts": [50, 200], "seeds": 3, "batch_size": 1, "c": 0.5, "beta_max_cap": 0.9}


def _problems(ctx: RunContext) -> dict[str, Any]:
    from amopt.problems import HuberRegression, LogisticRegression, NonconvexLogisticRegression

    probs = {
        "Huber (noise 0.5)": HuberRegression.planted(200, 10, delta=1.0, noise=0.5, seed=1),
        "Huber (interpolating)": HuberRegression.planted(200, 10, delta=1.0, seed=0),
        "non-convex logreg": NonconvexLogisticRegression.synthetic(
            200, 10, alpha=0.1, flip=0.1, seed=0
        ),
    }
    if not ctx.quick:
        probs["logreg a1a"] = LogisticRegression.from_libsvm("a1a")
    return probs


#: Which problems each theorem is checked on.
PLAN = {
    "3.1": ["Huber (noise 0.5)", "Huber (interpolating)", "logreg a1a"],
    "fixed-cap": ["Huber (noise 0.5)", "Huber (interpolating)", "logreg a1a"],
    "3.2": ["non-convex logreg", "logreg a1a"],
}


def run(ctx: RunContext) -> dict[str, Any]:
    """Run the theorem checks (see the module docstring)."""
    from amopt.problems import check_fixed_cap, check_theorem_3_1, check_theorem_3_2

    cfg = QUICK if ctx.quick else REAL
    t_start = time.perf_counter()
    probs = _problems(ctx)
    seeds = [ctx.seed + k for k in range(cfg["seeds"])]
    jobs = [
        (thm, name, T)
        for thm, names in PLAN.items()
        for name in names
        if name in probs
        for T in cfg["Ts"]
    ]
    rows = []
    bar = ctx.progress(jobs, desc="theory", unit="check")
    for thm, name, T in bar:
        prob = probs[name]
        t0 = time.perf_counter()
        if thm == "3.1":
            res = check_theorem_3_1(prob, T, seeds, batch_size=cfg["batch_size"])
        elif thm == "3.2":
            res = check_theorem_3_2(prob, T, seeds, c=cfg["c"], batch_size=cfg["batch_size"])
        else:
            res = check_fixed_cap(
                prob, T, seeds, beta_max=cfg["beta_max_cap"], batch_size=cfg["batch_size"]
            )
        rows.append(
            {
                "theorem": res.theorem,
                "problem": name,
                "T": res.T,
                "n_seeds": len(res.seeds),
                "lr": res.lr,
                "beta_max": res.beta_max,
                "measured": res.measured,
                "stderr": res.stderr,
                "bound": res.bound,
                "ratio": res.ratio,
                "passed": res.passed,
                "constants": res.constants,
                "seconds": time.perf_counter() - t0,
            }
        )
        ctx.log(f"[theory] {name}: {res}")
    slopes = []
    for thm, names in PLAN.items():
        for name in names:
            sel = [r for r in rows if r["theorem"] == thm and r["problem"] == name]
            if len(sel) >= 2 and all(r["measured"] > 0 for r in sel):
                lt = np.log10([r["T"] for r in sel])
                slope_m = float(np.polyfit(lt, np.log10([r["measured"] for r in sel]), 1)[0])
                slope_b = float(np.polyfit(lt, np.log10([r["bound"] for r in sel]), 1)[0])
                slopes.append(
                    {
                        "theorem": thm,
                        "problem": name,
                        "measured_slope": slope_m,
                        "bound_slope": slope_b,
                    }
                )
    plots = [_plot(ctx, rows)]
    n_pass = sum(r["passed"] for r in rows)
    claims = [
        {
            "claim": "Theorems 3.1, 3.2 and the fixed-cap bound (Supplement C)",
            "measured": f"measured <= bound in {n_pass}/{len(rows)} checks; largest ratio "
            f"{max(r['ratio'] for r in rows):.3g}",
            "verdict": "holds" if n_pass == len(rows) else "does not hold",
        }
    ]
    return {
        "experiment": "theory",
        "title": TITLE,
        "config": {**cfg, "plan": PLAN, "problems": list(probs)},
        "summary": {"checks": rows, "slopes": slopes},
        "claims": claims,
        "plots": plots,
        "wall_time_s": time.perf_counter() - t_start,
    }


def _plot(ctx: RunContext, rows: list[dict[str, Any]]) -> str:
    plt = pyplot()
    thms = [t for t in PLAN if any(r["theorem"] == t for r in rows)]
    fig, axes = plt.subplots(1, len(thms), figsize=(4.4 * len(thms), 3.8), squeeze=False)
    titles = {
        "3.1": "Thm 3.1: E f(x_T^(a)) - f*",
        "3.2": "Thm 3.2: min_t E ||grad f(x_t)||^2",
        "fixed-cap": "Fixed cap (beta_max = 0.9): E f(x_bar_T) - f*",
    }
    # one colour per problem in every panel, so that one legend (below the panels, where
    # it covers no line) serves them all
    palette = ["tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown"]
    problems = list(dict.fromkeys(r["problem"] for r in rows))
    colors = dict(zip(problems, palette * (1 + len(problems) // len(palette)), strict=False))
    for ax, thm in zip(axes[0], thms, strict=True):
        names = list(dict.fromkeys(r["problem"] for r in rows if r["theorem"] == thm))
        for name in names:
            color = colors[name]
            sel = [r for r in rows if r["theorem"] == thm and r["problem"] == name]
            T = [r["T"] for r in sel]
            ax.errorbar(
                T,
                [max(r["measured"], 1e-300) for r in sel],
                yerr=[r["stderr"] for r in sel],
                color=color,
                marker="o",
                ms=4,
                lw=1.2,
                capsize=2,
                label=f"{name}: measured",
            )
            ax.plot(
                T, [r["bound"] for r in sel], color=color, ls="--", lw=1.0, label=f"{name}: bound"
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("T (iterations)")
        ax.set_title(titles[thm])
    fig.suptitle(TITLE, fontsize=11)
    figure_legend(fig, list(axes.flat), ncol=2)
    return save_figure(fig, ctx.out / "theory.png")


def summary_markdown(result: dict[str, Any]) -> str:
    """Markdown table of the theorem checks."""
    cfg = result["config"]
    checks = [
        [
            r["theorem"],
            r["problem"],
            r["T"],
            r["lr"],
            r["beta_max"],
            f"{r['measured']:.3e} +- {r['stderr']:.1e}",
            f"{r['bound']:.3e}",
            r["ratio"],
            "yes" if r["passed"] else "**NO**",
        ]
        for r in result["summary"]["checks"]
    ]
    blocks = [
        f"Simplified AM-SGD (lam = 0, d_0 = 0, batch size {cfg['batch_size']}), expectations "
        f"over {cfg['seeds']} seeds; 3.1: lr = 1/sqrt(T), beta_max = 1/T; 3.2: lr = 1/sqrt(T), "
        f"beta_max = {cfg['c']} lr; fixed cap: lr = 1/sqrt(T), beta_max = {cfg['beta_max_cap']}.",
        (
            ["theorem", "problem", "T", "lr", "beta_max", "measured", "bound", "ratio", "passed"],
            checks,
        ),
    ]
    if result["summary"]["slopes"]:
        blocks.append("Log-log slope in T (measured vs bound):")
        blocks.append(
            (
                ["theorem", "problem", "measured slope", "bound slope"],
                [
                    [s["theorem"], s["problem"], s["measured_slope"], s["bound_slope"]]
                    for s in result["summary"]["slopes"]
                ],
            )
        )
    return markdown_summary(result, *blocks)
