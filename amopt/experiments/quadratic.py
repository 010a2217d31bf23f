"""``quadratic`` (paper Fig. 1): heavy ball with a fixed beta against AM-MGD on quadratics.

Ill-conditioned quadratics ``f(x) = 1/2 x^T A x - b^T x`` with a log-spaced spectrum
in ``[1/cond, 1]`` (:meth:`amopt.problems.Quadratic.from_spectrum`, Haar-random
eigenvectors, ``b ~ N(0, I)``), ``x_0 = 0``, ``lr = 1/L``:

* GD;
* damped heavy ball (amopt's ``"mgd"``, the paper's MGD: ``d = beta d + (1 - beta) g``)
  for every beta of a grid, and the grid-best ``beta*``;
* classical (undamped) Polyak heavy ball ``x+ = x - lr g + beta (x - x_prev)`` for the
  same grid (a stronger fixed-beta baseline: at ``lr = 1/L`` it can accelerate, the
  damped form cannot);
* AM-MGD (``beta_max = 1``, ``lam = 0``) with the exact and with the linearised numerator.

The ranking key of a run is the number of iterations to reach
``f - f* <= tol * (f(x_0) - f*)``, then the final gap.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ._common import RunContext, claim_verdict, first_below, markdown_summary, trace_minimize
from ._plots import STYLES, figure_legend, pyplot, save_figure

__all__ = ["run", "summary_markdown"]

TITLE = "Quadratics: fixed-beta heavy ball vs AM-MGD (paper Fig. 1)"

REAL = {
    "dim": 100,
    "conds": [1e2, 1e3, 1e4],
    "n_seeds": 3,
    "maxiter": 5000,
    "betas": [0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999],
    "tol": 1e-8,
}
QUICK = {
    "dim": 20,
    "conds": [1e2],
    "n_seeds": 1,
    "maxiter": 300,
    "betas": [0.5, 0.9, 0.99],
    "tol": 1e-8,
}


#: Legend text of the methods (each panel's title gives its beta*).
LABELS = {
    "MGD (0.9)": "MGD, damped heavy ball (beta = 0.9)",
    "MGD (beta*)": "MGD, damped heavy ball (grid-best beta*, in the title)",
    "HB (beta*)": "heavy ball, classical undamped (grid-best beta*, in the title)",
}


def _heavy_ball(prob: Any, x0: np.ndarray, lr: float, beta: float, maxiter: int) -> np.ndarray:
    """Classical Polyak heavy ball; returns ``f(x_t)`` for t = 0..maxiter."""
    x_prev = x0.copy()
    x = x0.copy()
    fs = np.empty(maxiter + 1)
    for t in range(maxiter + 1):
        f, g = prob.value_and_grad(x)
        fs[t] = float(f)
        if t == maxiter or not np.isfinite(fs[t]):
            fs[t + 1 :] = np.nan
            break
        x, x_prev = x - lr * g + beta * (x - x_prev), x
    return fs


def _padded(fs: np.ndarray, maxiter: int) -> np.ndarray:
    """``f`` of a run that stopped early (non-finite values) padded with NaN to maxiter + 1."""
    return np.concatenate([fs, np.full(maxiter + 1 - fs.size, np.nan)])


def _key(run: dict[str, Any]) -> tuple[float, float]:
    it = run["iters_to_tol"]
    final = run["final_rel_gap"]
    return (np.inf if it is None else it, np.inf if final is None else final)


def _stats(fs: np.ndarray, f_star: float, gap0: float, tol: float) -> dict[str, Any]:
    rel = (fs - f_star) / gap0
    finite = rel[np.isfinite(rel)]
    return {
        "rel_gap": rel,
        "final_rel_gap": float(rel[-1]) if np.isfinite(rel[-1]) else None,
        "best_rel_gap": float(np.min(finite)) if finite.size else None,
        "iters_to_tol": first_below(np.nan_to_num(rel, nan=np.inf), tol),
        "diverged": bool(not np.all(np.isfinite(rel))),
    }


def run(ctx: RunContext) -> dict[str, Any]:
    """Run the quadratic experiment; returns the result dict (see the module docstring)."""
    from amopt.problems import Quadratic

    cfg = QUICK if ctx.quick else REAL
    t_start = time.perf_counter()
    problems = []
    curves: dict[str, Any] = {}
    plot_data: dict[float, dict[str, Any]] = {}
    tol = cfg["tol"]
    n_runs = len(cfg["conds"]) * cfg["n_seeds"] * (3 + 2 * len(cfg["betas"]))
    bar = ctx.progress(total=n_runs * cfg["maxiter"], desc="quadratic", unit="it")
    for cond in cfg["conds"]:
        for k in range(cfg["n_seeds"]):
            seed = ctx.seed + k
            prob = Quadratic.from_spectrum(cfg["dim"], cond=cond, L=1.0, seed=seed)
            x0 = np.zeros(prob.dim)
            lr = 1.0 / prob.L
            f_star = prob.f_star
            gap0 = float(prob.fun(x0)) - f_star
            runs: dict[str, dict[str, Any]] = {}
            base = {"lr": lr, "maxiter": cfg["maxiter"]}

            tr = trace_minimize(prob.value_and_grad, x0, "gd", base, bar=bar)
            runs["GD"] = _stats(_padded(tr["f"], cfg["maxiter"]), f_star, gap0, tol)
            for numerator in ("exact", "linear"):
                tr = trace_minimize(
                    prob.value_and_grad,
                    x0,
                    "am-mgd",
                    {**base, "numerator": numerator, "beta_max": 1.0, "lam": 0.0},
                    bar=bar,
                )
                runs[f"AM-MGD ({numerator})"] = {
                    **_stats(_padded(tr["f"], cfg["maxiter"]), f_star, gap0, tol),
                    "betas": tr["betas"],
                    "mean_beta": float(np.mean(tr["betas"])),
                }
            damped: dict[float, dict[str, Any]] = {}
            undamped: dict[float, dict[str, Any]] = {}
            for beta in cfg["betas"]:
                tr = trace_minimize(
                    prob.value_and_grad, x0, "mgd", {**base, "beta": beta}, bar=bar
                )
                damped[beta] = _stats(_padded(tr["f"], cfg["maxiter"]), f_star, gap0, tol)
                fs = _heavy_ball(prob, x0, lr, beta, cfg["maxiter"])
                bar.update(cfg["maxiter"])
                undamped[beta] = _stats(fs, f_star, gap0, tol)
            b_damped = min(damped, key=lambda b: _key(damped[b]))
            b_undamped = min(undamped, key=lambda b: _key(undamped[b]))
            if 0.9 in damped:
                runs["MGD (0.9)"] = damped[0.9]
            runs["MGD (beta*)"] = damped[b_damped]
            runs["HB (beta*)"] = undamped[b_undamped]

            def beats(name: str, best: dict[str, Any], runs=runs) -> bool:
                return _key(runs[name]) < _key(best)

            verdict = {
                f"{am} beats {base_name}": beats(am, best)
                for am in ("AM-MGD (exact)", "AM-MGD (linear)")
                for base_name, best in (
                    ("best damped MGD", damped[b_damped]),
                    ("best heavy ball", undamped[b_undamped]),
                )
            }
            entry = {
                "cond": cond,
                "seed": seed,
                "dim": prob.dim,
                "f_star": f_star,
                "gap0": gap0,
                "beta_star_damped": b_damped,
                "beta_star_heavy_ball": b_undamped,
                "methods": {
                    name: {k2: v for k2, v in r.items() if k2 not in ("rel_gap", "betas")}
                    for name, r in runs.items()
                },
                "grid_damped": {
                    str(b): {k2: v for k2, v in r.items() if k2 != "rel_gap"}
                    for b, r in damped.items()
                },
                "grid_heavy_ball": {
                    str(b): {k2: v for k2, v in r.items() if k2 != "rel_gap"}
                    for b, r in undamped.items()
                },
                "verdict": verdict,
            }
            problems.append(entry)
            key = f"cond={cond:g},seed={seed}"
            curves[key] = {name: ctx.curve(r["rel_gap"]) for name, r in runs.items()}
            for name in ("AM-MGD (exact)", "AM-MGD (linear)"):
                curves[key][f"beta {name}"] = ctx.curve(runs[name]["betas"])
            if k == 0:
                plot_data[cond] = {"runs": runs, "b_damped": b_damped, "b_undamped": b_undamped}
            ctx.log(
                f"[quadratic] cond={cond:g} seed={seed}: iterations to {tol:g}: "
                + ", ".join(
                    f"{n} {'not reached' if r['iters_to_tol'] is None else r['iters_to_tol']}"
                    for n, r in runs.items()
                )
                + f" (MGD beta* = {b_damped}, HB beta* = {b_undamped})"
            )
    bar.close()

    plots = [_plot(ctx, plot_data, cfg)]
    n = len(problems)
    claims = []
    for am in ("AM-MGD (exact)", "AM-MGD (linear)"):
        wins_d = sum(p["verdict"][f"{am} beats best damped MGD"] for p in problems)
        wins_h = sum(p["verdict"][f"{am} beats best heavy ball"] for p in problems)
        claims.append(
            {
                "claim": f"Fig. 1: AM beats every fixed beta ({am})",
                "measured": f"faster than the grid-best damped MGD on {wins_d}/{n} problems, "
                f"than the grid-best classical heavy ball on {wins_h}/{n}",
                "verdict": claim_verdict(min(wins_d, wins_h), n),
            }
        )
    return {
        "experiment": "quadratic",
        "title": TITLE,
        "config": {**cfg, "lr": "1/L", "x0": "zeros", "L": 1.0, "spectrum": "log-spaced"},
        "summary": {"problems": problems},
        "claims": claims,
        "curves": curves,
        "plots": plots,
        "wall_time_s": time.perf_counter() - t_start,
    }


def _plot(ctx: RunContext, plot_data: dict[float, dict[str, Any]], cfg: dict[str, Any]) -> str:
    plt = pyplot()
    conds = list(plot_data)
    fig, axes = plt.subplots(2, len(conds), figsize=(4.2 * len(conds), 6.2), squeeze=False)
    for j, cond in enumerate(conds):
        d = plot_data[cond]
        ax = axes[0, j]
        for name, r in d["runs"].items():
            color, ls = STYLES.get(name, ("k", ":"))
            y = np.clip(np.abs(r["rel_gap"]), 1e-17, None)
            label = LABELS.get(name, name)
            ax.semilogy(np.arange(y.size), y, color=color, ls=ls, lw=1.3, label=label)
        ax.axhline(cfg["tol"], color="k", lw=0.6, ls=":", label=f"tolerance {cfg['tol']:g}")
        # beta* differs between panels: it is in each title, not in the shared legend
        ax.set_title(f"cond = {cond:g}: MGD beta* = {d['b_damped']}, HB beta* = {d['b_undamped']}")
        ax.set_xlabel("iteration t")
        ax.set_ylabel("(f(x_t) - f*) / (f(x_0) - f*)")
        ax = axes[1, j]
        for name in ("AM-MGD (exact)", "AM-MGD (linear)"):
            color, _ = STYLES[name]
            b = d["runs"][name]["betas"]
            ax.plot(np.arange(1, b.size + 1), b, color=color, lw=0.6, label=name)
        ax.set_xscale("log")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("iteration t")
        ax.set_ylabel("beta_t of AM-MGD")
    fig.suptitle(f"{TITLE}; d = {cfg['dim']}, lr = 1/L", fontsize=11)
    figure_legend(fig, list(axes.flat))
    return save_figure(fig, ctx.out / "quadratic.png")


#: The verdict columns of the summary table: (AM rule, baseline, column header).
BEATS = [
    ("AM-MGD (exact)", "best damped MGD", "exact beats MGD(beta*)"),
    ("AM-MGD (exact)", "best heavy ball", "exact beats HB(beta*)"),
    ("AM-MGD (linear)", "best damped MGD", "linear beats MGD(beta*)"),
    ("AM-MGD (linear)", "best heavy ball", "linear beats HB(beta*)"),
]


def summary_markdown(result: dict[str, Any]) -> str:
    """Markdown tables of the quadratic experiment."""
    cfg = result["config"]
    problems = result["summary"]["problems"]
    names = ["GD", "MGD (0.9)", "MGD (beta*)", "HB (beta*)", "AM-MGD (exact)", "AM-MGD (linear)"]
    rows = []
    for p in problems:
        row = [
            f"{p['cond']:g}",
            str(p["seed"]),
            str(p["beta_star_damped"]),
            str(p["beta_star_heavy_ball"]),
        ]
        for name in names:
            m = p["methods"].get(name)
            if m is None:
                row.append("")
                continue
            it = "-" if m["iters_to_tol"] is None else str(m["iters_to_tol"])
            gap = m["final_rel_gap"]
            row.append(f"{it} ({gap:.1e})" if gap is not None else f"{it} (nan)")
        v = p["verdict"]
        row += ["yes" if v[f"{am} beats {base}"] else "no" for am, base, _ in BEATS]
        rows.append(row)
    sensitivity = []
    seen = set()
    for p in problems:
        if p["cond"] in seen:
            continue
        seen.add(p["cond"])
        for kind, grid in (("MGD", p["grid_damped"]), ("HB", p["grid_heavy_ball"])):
            sensitivity.append(
                [f"{p['cond']:g}", kind]
                + [
                    "-" if g["iters_to_tol"] is None else str(g["iters_to_tol"])
                    for g in grid.values()
                ]
            )
    return markdown_summary(
        result,
        f"d = {cfg['dim']}, log-spaced spectrum in [1/cond, 1], lr = 1/L, x0 = 0, "
        f"{cfg['maxiter']} iterations, {cfg['n_seeds']} seeds per condition number. "
        f"Cells: iterations to reach (f - f*) <= {cfg['tol']:g} (f(x0) - f*), "
        "'-' = not reached; in brackets the final relative gap; 'exact' and 'linear' are "
        "AM-MGD with either numerator, 'beats' = fewer iterations to the tolerance (then a "
        "lower final gap). MGD is damped heavy ball "
        "(the paper's and torch's dampening = beta convention); HB is classical Polyak heavy "
        f"ball. beta* is the best of the grid {cfg['betas']}.",
        (
            ["cond", "seed", "MGD beta*", "HB beta*", *names, *(head for *_, head in BEATS)],
            rows,
        ),
        "Mean beta_t of AM-MGD (exact / linear):",
        (
            ["cond", "seed", "exact", "linear"],
            [
                [
                    f"{p['cond']:g}",
                    str(p["seed"]),
                    p["methods"]["AM-MGD (exact)"]["mean_beta"],
                    p["methods"]["AM-MGD (linear)"]["mean_beta"],
                ]
                for p in problems
            ],
        ),
        "Sensitivity to beta (iterations to tolerance, first seed):",
        (["cond", "method", *[f"beta={b}" for b in cfg["betas"]]], sensitivity),
    )
