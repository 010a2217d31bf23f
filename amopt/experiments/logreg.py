"""``logreg`` (paper Fig. 3 and Supplement) and ``logreg-adam``: LIBSVM logistic regression.

``logreg``: binary logistic regression without regularisation (``l2 = 0``) on
a9a, w8a, mushrooms, phishing, ijcnn1 and madelon, ``x_0 = 0``, ``lr = 1/L``
(:attr:`amopt.problems.LogisticRegression.L`), 10,000 full-gradient iterations of

* GD, MGD(beta = 0.9) (damped heavy ball, the paper's MGD),
* MGD(beta*) with beta* the grid value of lowest final loss (per data set; the
  plots name it in each panel's title),
* classical (undamped) Polyak heavy ball ``x+ = x - lr g + beta (x - x_prev)``,
  "HB (beta*)", over the same beta grid (not a method of the paper: at
  ``lr = 1/L`` it can accelerate where the damped MGD cannot),
* AM-MGD (``lam = 0``, ``beta_max = 1``) with the exact numerator (the paper's
  deterministic rule) and with the linearised one,

and, as the reference a practitioner would otherwise reach for, scipy's L-BFGS-B
and CG on the same objective: iterations, function evaluations and seconds
until they reach the suboptimality ``f - f*`` that AM-MGD (exact) and the best
first-order method reached. ``f*`` comes from
:meth:`~amopt.problems.LogisticRegression.reference_solution` (L-BFGS-B to
``max|grad| <= 1e-10``, cached on disk in the user cache directory, never in the
data folder; see ``docs/caching.md``).

``logreg-adam``: Adam against AM-Adam (``lam = 0.1``, linearised numerator, the
library default; and the exact numerator), ``lr = 1e-3``, 1000 iterations.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ._common import RunContext, claim_verdict, first_below, markdown_summary, trace_minimize
from ._data import load_logreg_problem
from ._plots import STYLES, figure_legend, pyplot, save_figure

__all__ = ["run", "run_adam", "summary_markdown", "summary_markdown_adam"]

TITLE = "LIBSVM logistic regression, lr = 1/L: GD / MGD / heavy ball / AM-MGD (paper Fig. 3)"
TITLE_ADAM = "LIBSVM logistic regression, lr = 1e-3: Adam vs AM-Adam (paper Supplement)"

SETS = ["a9a", "w8a", "mushrooms", "phishing", "ijcnn1", "madelon"]
REAL = {"maxiter": 10_000, "betas": [0.5, 0.7, 0.9, 0.95, 0.99], "scipy_maxiter": 20_000}
QUICK = {"maxiter": 200, "betas": [0.5, 0.9, 0.99], "scipy_maxiter": 2_000}
QUICK_SETS = ["mushrooms", "a1a"]
REAL_ADAM = {"maxiter": 1000, "lr": 1e-3}
QUICK_ADAM = {"maxiter": 100, "lr": 1e-3}
#: Suboptimality targets are floored here (below it f - f* is rounding noise).
TARGET_FLOOR = 1e-12
#: The AM runs of ``logreg`` and of ``logreg-adam``.
AM_MGD = ("AM-MGD (exact)", "AM-MGD (linear)")
AM_ADAM = ("AM-Adam (linear)", "AM-Adam (exact)")


def _datasets(ctx: RunContext) -> list[str]:
    if ctx.datasets:
        return list(ctx.datasets)
    return QUICK_SETS if ctx.quick else SETS


def _load(ctx: RunContext, spec: str) -> tuple[Any, dict[str, Any], float, float]:
    """The problem, its description for the JSON, ``f*`` and the load time in seconds."""
    t0 = time.perf_counter()
    name, prob, source = load_logreg_problem(spec, ctx.data_dir, download=ctx.download)
    t1 = time.perf_counter()
    with ctx.cache_notices():
        f_star = float(prob.f_star)
    ctx.log(
        f"[logreg] {name}: n={prob.n_samples} d={prob.dim} L={prob.L:.4g} f*={f_star:.10g} "
        f"(load {t1 - t0:.1f} s, reference {time.perf_counter() - t1:.1f} s)"
    )
    info = {"dataset": name, "source": source, "n_samples": prob.n_samples, "dim": prob.dim}
    return prob, info, f_star, t1 - t0


def _traces(
    ctx: RunContext,
    prob: Any,
    runs: dict[str, tuple[str, dict[str, Any]]],
    base: dict[str, Any],
    desc: str,
) -> dict[str, dict[str, Any]]:
    """:func:`trace_minimize` from ``x_0 = 0`` for each ``label: (method, extra options)``."""
    x0 = np.zeros(prob.dim)
    bar = ctx.progress(total=len(runs) * base["maxiter"], desc=desc, unit="it")
    traces = {
        label: trace_minimize(prob.value_and_grad, x0, method, {**base, **extra}, bar=bar)
        for label, (method, extra) in runs.items()
    }
    bar.close()
    return traces


def _heavy_ball_trace(prob: Any, lr: float, beta: float, maxiter: int, bar: Any) -> dict:
    """Classical (undamped) Polyak heavy ball from ``x_0 = 0``, recorded as
    :func:`trace_minimize` records a run (``f``, ``seconds``, ``time_s``, ``nit``)."""
    x = x_prev = np.zeros(prob.dim)
    fs, stamps = np.full(maxiter + 1, np.nan), np.zeros(maxiter + 1)
    start = time.perf_counter()
    nit = 0
    for t in range(maxiter + 1):
        f, g = prob.value_and_grad(x)
        fs[t], stamps[t] = float(f), time.perf_counter() - start
        if t == maxiter or not np.isfinite(fs[t]):
            break
        # Polyak: x+ = x - lr g + beta (x - x_prev), no (1 - beta) damping of the gradient
        x, x_prev = x - lr * g + beta * (x - x_prev), x
        nit += 1
        if bar is not None:
            bar.update(1)
    return {"f": fs, "betas": None, "seconds": stamps, "time_s": stamps[nit], "nit": nit}


def _curves(
    ctx: RunContext, gaps: dict[str, np.ndarray], betas: dict[str, np.ndarray]
) -> dict[str, Any]:
    """The JSON curves of one data set: ``|f - f*|`` and ``beta_t`` of each method."""
    curves = {m: ctx.curve(np.abs(g)) for m, g in gaps.items()}
    curves.update({f"beta {m}": ctx.curve(b) for m, b in betas.items()})
    return curves


def _wins_claim(
    per_set: list[dict[str, Any]], key: str, claim: str, *, name_wins: bool = False
) -> dict[str, Any]:
    """A claim that holds on the data sets whose ``verdict[key]`` is true."""
    n = len(per_set)
    wins = [p["dataset"] for p in per_set if p["verdict"][key]]
    measured = f"lower final loss on {len(wins)}/{n} data sets"
    if name_wins and wins and len(wins) < n:
        measured += f" ({', '.join(wins)})"
    return {"claim": claim, "measured": measured, "verdict": claim_verdict(len(wins), n)}


def _scipy_to_target(
    prob: Any, method: str, f_star: float, targets: dict[str, float], maxiter: int
) -> dict[str, Any]:
    """scipy.optimize.minimize until every target gap is reached (or ``maxiter``)."""
    import scipy.optimize

    nfev = [0]

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        nfev[0] += 1
        f, g = prob.value_and_grad(x)
        return float(f), np.asarray(g)

    x0 = np.zeros(prob.dim)
    f0 = fun(x0)[0]
    nfev[0] = 0
    gaps, stamps, evals = [f0 - f_star], [0.0], [0]
    lowest = min(targets.values())
    start = time.perf_counter()

    def callback(intermediate_result: Any) -> None:
        gaps.append(float(intermediate_result.fun) - f_star)
        stamps.append(time.perf_counter() - start)
        evals.append(nfev[0])
        if gaps[-1] <= lowest:
            raise StopIteration

    if method == "L-BFGS-B":
        options = {"maxiter": maxiter, "maxfun": 10 * maxiter, "ftol": 0.0, "gtol": 0.0}
    else:
        options = {"maxiter": maxiter, "gtol": 0.0}
    res = scipy.optimize.minimize(
        fun, x0, jac=True, method=method, options=options, callback=callback
    )
    out: dict[str, Any] = {
        "nit": len(gaps) - 1,
        "nfev_total": nfev[0],
        "best_gap": float(np.min(gaps)),
        "message": str(res.message),
        "gap_curve": np.asarray(gaps),
    }
    for label, target in targets.items():
        i = first_below(gaps, target)
        out[f"to_{label}"] = {
            "target_gap": target,
            "iterations": i,
            "nfev": None if i is None else evals[i],
            "seconds": None if i is None else stamps[i],
        }
    return out


def run(ctx: RunContext) -> dict[str, Any]:
    """Run the ``logreg`` experiment (see the module docstring)."""
    cfg = QUICK if ctx.quick else REAL
    t_start = time.perf_counter()
    sets = _datasets(ctx)
    per_set: list[dict[str, Any]] = []
    curves: dict[str, Any] = {}
    plot_data: dict[str, Any] = {}
    am = {"lam": 0.0, "beta_max": 1.0}
    runs = {
        "GD": ("gd", {}),
        **{f"MGD ({beta})": ("mgd", {"beta": beta}) for beta in cfg["betas"]},
        "AM-MGD (exact)": ("am-mgd", {"numerator": "exact", **am}),
        "AM-MGD (linear)": ("am-mgd", {"numerator": "linear", **am}),
    }
    for spec in sets:
        prob, info, f_star, load_s = _load(ctx, spec)
        name = info["dataset"]
        lr = 1.0 / prob.L
        base = {"lr": lr, "maxiter": cfg["maxiter"]}
        traces = _traces(ctx, prob, runs, base, f"logreg {name}")
        grid = {beta: traces[f"MGD ({beta})"] for beta in cfg["betas"]}
        beta_star = min(grid, key=lambda b: _rank(grid[b]["f"] - f_star))
        traces["MGD (beta*)"] = grid[beta_star]
        bar = ctx.progress(total=len(cfg["betas"]) * cfg["maxiter"], desc=f"heavy ball {name}")
        hb_grid = {
            beta: _heavy_ball_trace(prob, lr, beta, cfg["maxiter"], bar) for beta in cfg["betas"]
        }
        bar.close()
        hb_star = min(hb_grid, key=lambda b: _rank(hb_grid[b]["f"] - f_star))
        traces["HB (beta*)"] = hb_grid[hb_star]
        first_order = ["GD", "MGD (0.9)", "MGD (beta*)", "HB (beta*)", *AM_MGD]
        first_order = [m for m in first_order if m in traces]
        gaps = {m: traces[m]["f"] - f_star for m in first_order}
        best_method = min(first_order, key=lambda m: _rank(gaps[m]))
        targets = {
            "am_exact": max(float(gaps["AM-MGD (exact)"][-1]), TARGET_FLOOR),
            "best_first_order": max(float(gaps[best_method][-1]), TARGET_FLOOR),
        }
        methods: dict[str, dict[str, Any]] = {}
        for m in first_order:
            tr = traces[m]
            entry = {
                "final_f": float(tr["f"][-1]),
                "final_gap": float(gaps[m][-1]),
                "iters_to_floor": first_below(gaps[m], TARGET_FLOOR),
                "nit": tr["nit"],
                "time_s": tr["time_s"],
                "ms_per_iter": 1e3 * tr["time_s"] / max(tr["nit"], 1),
            }
            if tr["betas"] is not None:
                entry["mean_beta"] = float(np.mean(tr["betas"]))
                entry["median_beta"] = float(np.median(tr["betas"]))
                entry["frac_beta_at_cap"] = float(np.mean(tr["betas"] >= 1.0 - 1e-12))
                entry["frac_beta_zero"] = float(np.mean(tr["betas"] <= 0.0))
            for label, target in targets.items():
                i = first_below(gaps[m], target)
                entry[f"to_{label}"] = {
                    "iterations": i,
                    "seconds": None if i is None else float(tr["seconds"][i]),
                }
            methods[m] = entry
        scipy_runs = {}
        for method in ("L-BFGS-B", "CG"):
            scipy_runs[method] = _scipy_to_target(
                prob, method, f_star, targets, cfg["scipy_maxiter"]
            )
        best_fixed = min(
            [m for m in ("GD", "MGD (0.9)", "MGD (beta*)") if m in gaps],
            key=lambda m: _rank(gaps[m]),
        )
        per_set.append(
            {
                **info,
                "L": prob.L,
                "lr": lr,
                "f_star": f_star,
                "load_s": load_s,
                "beta_star": beta_star,
                "beta_star_heavy_ball": hb_star,
                "grid_final_f": {str(b): float(tr["f"][-1]) for b, tr in grid.items()},
                "grid_final_f_heavy_ball": {
                    str(b): float(tr["f"][-1]) for b, tr in hb_grid.items()
                },
                "methods": methods,
                "best_first_order": best_method,
                "targets": targets,
                "scipy": {
                    k: {k2: v2 for k2, v2 in v.items() if k2 != "gap_curve"}
                    for k, v in scipy_runs.items()
                },
                "verdict": {
                    **{
                        f"{m} lowest loss": _rank(gaps[m]) < _rank(gaps[best_fixed])
                        for m in AM_MGD
                    },
                    **{
                        f"{m} beats heavy ball": _rank(gaps[m]) < _rank(gaps["HB (beta*)"])
                        for m in AM_MGD
                    },
                },
            }
        )
        betas = {m: traces[m]["betas"] for m in AM_MGD}
        curves[name] = _curves(ctx, gaps, betas)
        for k, v in scipy_runs.items():
            curves[name][k] = ctx.curve(np.abs(v["gap_curve"]))
        plot_data[name] = {
            "gaps": gaps, "betas": betas, "beta_star": beta_star, "beta_star_heavy_ball": hb_star
        }  # fmt: skip
        ctx.log(
            f"[logreg] {name}: f - f* after {cfg['maxiter']} iterations: "
            + ", ".join(f"{m} {methods[m]['final_gap']:.3e}" for m in first_order)
            + f" (MGD beta* = {beta_star}, HB beta* = {hb_star})"
        )
    plots = [_plot(ctx, plot_data, cfg["maxiter"]), _plot_betas(ctx, plot_data)]
    claims = [
        _wins_claim(
            per_set,
            f"{m} lowest loss",
            f"Fig. 3: AM-MGD reaches a lower loss than GD, MGD(0.9) and MGD(beta*) "
            f"({m.split('(')[1][:-1]} numerator)",
            name_wins=True,
        )
        for m in AM_MGD
    ]
    claims.append(
        _wins_claim(
            per_set,
            "AM-MGD (exact) beats heavy ball",
            "(not a paper claim) AM-MGD (exact) reaches a lower loss than classical "
            "(undamped) heavy ball with its grid-best beta",
            name_wins=True,
        )
    )
    claims[-1]["verdict"] = "n/a"
    faster = []
    for p in per_set:
        am_s = p["methods"]["AM-MGD (exact)"]["to_am_exact"]["seconds"]
        lb = p["scipy"]["L-BFGS-B"]["to_am_exact"]["seconds"]
        if lb is not None and am_s is not None and lb < am_s:
            faster.append(p["dataset"])
    claims.append(
        {
            "claim": "(not a paper claim) L-BFGS-B as the practical reference",
            "measured": f"L-BFGS-B reaches AM-MGD's final suboptimality in less time on "
            f"{len(faster)}/{len(per_set)} data sets",
            "verdict": "n/a",
        }
    )
    return {
        "experiment": "logreg",
        "title": TITLE,
        "config": {**cfg, "datasets": sets, "lr": "1/L", "l2": 0.0, "x0": "zeros"},
        "summary": {"datasets": per_set},
        "claims": claims,
        "curves": curves,
        "plots": plots,
        "wall_time_s": time.perf_counter() - t_start,
    }


def _rank(gap: np.ndarray) -> tuple[float, float]:
    """Ranking key of a run: final ``f - f*`` floored at :data:`TARGET_FLOOR`, then the
    iteration at which it first reached the floor (so runs that all converge to rounding
    level are ranked by speed, not by rounding noise)."""
    hit = first_below(gap, TARGET_FLOOR)
    return (max(float(gap[-1]), TARGET_FLOOR), np.inf if hit is None else float(hit))


def _grid_plot(
    ctx: RunContext,
    data: dict[str, Any],
    draw: Callable[[Any, Any], None],
    *,
    height: float,
    ylabel: str,
    title: str,
    filename: str,
    panel_title: Callable[[str, Any], str] = lambda name, d: name,
) -> str:
    """One panel per data set, up to three in a row: ``draw(ax, data[name])`` fills each.

    The legend is one for the whole figure, below the panels (it never covers a
    curve); what differs between panels (beta*) is in each panel's title.
    """
    plt = pyplot()
    cols = min(len(data), 3)
    rows = (len(data) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.3 * cols, height * rows), squeeze=False)
    for ax, (name, d) in zip(axes.flat, data.items(), strict=False):
        draw(ax, d)
        ax.set_title(panel_title(name, d))
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
    for ax in list(axes.flat)[len(data) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    figure_legend(fig, list(axes.flat)[: len(data)])
    return save_figure(fig, ctx.out / filename)


#: Legend text of each method of the plots (the panel titles give each panel's beta*).
LABELS = {
    "MGD (0.9)": "MGD, damped heavy ball (beta = 0.9)",
    "MGD (beta*)": "MGD, damped heavy ball (grid-best beta*, in the title)",
    "HB (beta*)": "heavy ball, classical undamped (grid-best beta*, in the title)",
}


def _beta_title(name: str, d: dict[str, Any]) -> str:
    """A panel's title: the data set and the beta* its MGD (and heavy-ball) curves use."""
    parts = [f"MGD beta* = {d['beta_star']}"]
    if d.get("beta_star_heavy_ball") is not None:
        parts.append(f"HB beta* = {d['beta_star_heavy_ball']}")
    return f"{name} ({', '.join(parts)})"


def _gap_lines(ax: Any, gaps: dict[str, np.ndarray]) -> None:
    for m, gap in gaps.items():
        color, ls = STYLES[m]
        label = LABELS.get(m, m)
        ax.semilogy(
            np.arange(gap.size),
            np.clip(np.abs(gap), 1e-16, None),
            color=color,
            ls=ls,
            lw=1.2,
            label=label,
        )


def _plot(ctx: RunContext, data: dict[str, Any], maxiter: int) -> str:
    def draw(ax: Any, d: dict[str, Any]) -> None:
        _gap_lines(ax, d["gaps"])
        ax.set_xlim(0, maxiter)

    return _grid_plot(
        ctx,
        data,
        draw,
        height=3.4,
        ylabel="f(x_t) - f*",
        title=TITLE,
        filename="logreg.png",
        panel_title=_beta_title,
    )


def _plot_betas(ctx: RunContext, data: dict[str, Any]) -> str:
    def draw(ax: Any, d: dict[str, Any]) -> None:
        for m, b in d["betas"].items():
            color, _ = STYLES[m]
            ax.plot(np.arange(1, b.size + 1), b, color=color, lw=0.4, alpha=0.8, label=m)
        ax.set_xscale("log")
        ax.set_ylim(-0.02, 1.02)

    return _grid_plot(
        ctx,
        data,
        draw,
        height=2.6,
        ylabel="beta_t",
        title="AM-MGD beta_t on LIBSVM logistic regression (lr = 1/L, lam = 0)",
        filename="logreg_betas.png",
    )


def summary_markdown(result: dict[str, Any]) -> str:
    """Markdown tables of ``logreg``."""
    cfg = result["config"]
    datasets = result["summary"]["datasets"]
    methods = ["GD", "MGD (0.9)", "MGD (beta*)", "HB (beta*)", *AM_MGD]
    # results stored before the heavy-ball baseline have no such column
    methods = [m for m in methods if any(m in p["methods"] for p in datasets)]

    def key(mm: dict[str, Any]) -> tuple[float, float]:
        hit = mm.get("iters_to_floor")
        return (max(mm["final_gap"], TARGET_FLOOR), np.inf if hit is None else hit)

    gaps = []
    for p in datasets:
        present = [m for m in methods if m in p["methods"]]
        best = min(present, key=lambda m: key(p["methods"][m]))
        row = [p["dataset"], f"{p['n_samples']} x {p['dim']}", p["L"], p["f_star"]]
        row.append(str(p["beta_star"]))
        if "HB (beta*)" in methods:
            row.append(str(p.get("beta_star_heavy_ball", "-")))
        for m in methods:
            mm = p["methods"].get(m)
            if mm is None:
                cell = ""
            elif mm["final_gap"] <= TARGET_FLOOR and mm.get("iters_to_floor") is not None:
                cell = f"< {TARGET_FLOOR:g} at t = {mm['iters_to_floor']}"
            else:
                cell = f"{mm['final_gap']:.3e}"
            row.append(f"**{cell}**" if m == best else cell)
        gaps.append(row)
    betas = []
    for p in datasets:
        m = p["methods"]["AM-MGD (exact)"]
        betas.append(
            [
                p["dataset"],
                m["mean_beta"],
                m["median_beta"],
                m["frac_beta_at_cap"],
                m["frac_beta_zero"],
            ]
        )
    reach = []
    for p in datasets:
        for m in dict.fromkeys(["AM-MGD (exact)", p["best_first_order"], "L-BFGS-B", "CG"]):
            if m in p["methods"]:
                e = p["methods"][m]
                label = m if m != p["best_first_order"] or m == "AM-MGD (exact)" else f"{m} (best)"
                nfev = ("", "")
            else:
                e = p["scipy"][m]
                label = m
                nfev = (e["to_am_exact"]["nfev"], e["to_best_first_order"]["nfev"])
            a, b = e["to_am_exact"], e["to_best_first_order"]
            reach.append(
                [
                    p["dataset"],
                    label,
                    f"{p['targets']['am_exact']:.2e}",
                    a["iterations"],
                    nfev[0],
                    a["seconds"],
                    f"{p['targets']['best_first_order']:.2e}",
                    b["iterations"],
                    nfev[1],
                    b["seconds"],
                ]
            )
    return markdown_summary(
        result,
        f"l2 = 0, x0 = 0, lr = 1/L, {cfg['maxiter']} iterations; beta* = grid value of "
        f"lowest final loss over {cfg['betas']}; MGD is the paper's damped heavy ball "
        "(d = beta d + (1 - beta) g)"
        + (
            ", HB classical (undamped) Polyak heavy ball (x+ = x - lr g + beta (x - x_prev))"
            if "HB (beta*)" in methods
            else ""
        )
        + "; AM-MGD: lam = 0, beta_max = 1. "
        f"Cells: final f(x_T) - f*; below {TARGET_FLOOR:g} (rounding level) the iteration "
        "that first reached it is shown instead, and runs are ranked by it (bold: best).",
        (
            [
                "data set",
                "n x d",
                "L",
                "f*",
                "MGD beta*",
                *(["HB beta*"] if "HB (beta*)" in methods else []),
                *methods,
            ],
            gaps,
        ),
        "AM-MGD beta_t (exact numerator): mean, median, fraction of steps with beta_t exactly "
        "1 (to 1e-12) and exactly 0 (step 0 is always 0).",
        (["data set", "mean", "median", "= 1", "= 0"], betas),
        "Reaching the same suboptimality: iterations / seconds until f - f* <= the final gap "
        "of AM-MGD (exact) (left) and of the best first-order method (right); the first-order "
        "methods' seconds come from their own runs (one gradient per iteration), scipy's "
        f"from L-BFGS-B / CG runs (at most {cfg['scipy_maxiter']} iterations).",
        (
            [
                "data set",
                "method",
                "target",
                "iters",
                "f evals",
                "seconds",
                "target",
                "iters",
                "f evals",
                "seconds",
            ],
            reach,
        ),
    )


# --------------------------------------------------------------------------- logreg-adam


def run_adam(ctx: RunContext) -> dict[str, Any]:
    """Run ``logreg-adam``: Adam vs AM-Adam on the same data sets (see the module docstring)."""
    cfg = QUICK_ADAM if ctx.quick else REAL_ADAM
    t_start = time.perf_counter()
    sets = _datasets(ctx)
    per_set = []
    curves: dict[str, Any] = {}
    plot_data: dict[str, Any] = {}
    runs = {
        "Adam": ("adam", {}),
        "AM-Adam (linear)": ("am-adam", {"numerator": "linear", "lam": 0.1}),
        "AM-Adam (exact)": ("am-adam", {"numerator": "exact", "lam": 0.1}),
    }
    base = {"lr": cfg["lr"], "maxiter": cfg["maxiter"]}
    for spec in sets:
        prob, info, f_star, _ = _load(ctx, spec)
        name = info["dataset"]
        traces = _traces(ctx, prob, runs, base, f"logreg-adam {name}")
        methods = {}
        gaps = {}
        betas = {}
        for label, tr in traces.items():
            gaps[label] = tr["f"] - f_star
            methods[label] = {
                "final_f": float(tr["f"][-1]),
                "final_gap": float(gaps[label][-1]),
                "time_s": tr["time_s"],
            }
            if tr["betas"] is not None:
                betas[label] = tr["betas"]
                methods[label]["mean_beta"] = float(np.mean(tr["betas"]))
        adam = methods["Adam"]["final_f"]
        per_set.append(
            {
                **info,
                "f_star": f_star,
                "methods": methods,
                "verdict": {f"{m} lower than Adam": methods[m]["final_f"] < adam for m in AM_ADAM},
            }
        )
        curves[name] = _curves(ctx, gaps, betas)
        plot_data[name] = gaps
        ctx.log(
            f"[logreg-adam] {name}: "
            + ", ".join(f"{m} {v['final_gap']:.3e}" for m, v in methods.items())
        )
    plots = [_plot_adam(ctx, plot_data)]
    claims = [
        _wins_claim(
            per_set, f"{m} lower than Adam", f"Supplement: AM-Adam beats Adam at lr = 1e-3 ({m})"
        )
        for m in AM_ADAM
    ]
    return {
        "experiment": "logreg-adam",
        "title": TITLE_ADAM,
        "config": {
            **cfg,
            "datasets": sets,
            "betas": [0.9, 0.999],
            "lam": 0.1,
            "l2": 0.0,
            "x0": "zeros",
        },
        "summary": {"datasets": per_set},
        "claims": claims,
        "curves": curves,
        "plots": plots,
        "wall_time_s": time.perf_counter() - t_start,
    }


def _plot_adam(ctx: RunContext, data: dict[str, Any]) -> str:
    return _grid_plot(
        ctx,
        data,
        _gap_lines,
        height=3.2,
        ylabel="f(x_t) - f*",
        title=TITLE_ADAM,
        filename="logreg_adam.png",
    )


def summary_markdown_adam(result: dict[str, Any]) -> str:
    """Markdown table of ``logreg-adam``."""
    cfg = result["config"]
    methods = ["Adam", *AM_ADAM]
    rows = []
    for p in result["summary"]["datasets"]:
        best = min(methods, key=lambda m: p["methods"][m]["final_gap"])
        row = [p["dataset"]]
        for m in methods:
            e = p["methods"][m]
            cell = f"{e['final_gap']:.6e}"
            if "mean_beta" in e:
                cell += f" ({e['mean_beta']:.2f})"
            row.append(f"**{cell}**" if m == best else cell)
        rows.append(row)
    return markdown_summary(
        result,
        f"l2 = 0, x0 = 0, lr = {cfg['lr']:g}, betas = (0.9, 0.999), {cfg['maxiter']} "
        "full-gradient iterations; AM-Adam: lam = 0.1, per-array beta, beta1_max = 0.9. "
        "Cells: final f - f* (mean beta_1 in brackets).",
        (["data set", *methods], rows),
    )
