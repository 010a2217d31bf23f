"""``python -m amopt``: AM-MGD against the methods a user would pick instead, ranked.

Logistic regression on a LIBSVM data set that ships with the package (the paper's
Fig. 3 setting, ``lr = 1/L``), the same number of iterations for every method:

* GD at ``lr = 1/L``;
* damped momentum MGD (``d = beta d + (1 - beta) g``, ``beta = 0.9``), the momentum
  the paper's AM-MGD adapts: no faster than GD at ``lr = 1/L``;
* classical (undamped) heavy ball and Nesterov momentum at their textbook tuning
  from L and mu (:func:`amopt.bench._problem_set.textbook`): with ``--l2 0`` the
  loss is not strongly convex (mu = 0) and both run at ``lr = 1/L``, ``beta = 0.9``;
* scipy's L-BFGS-B on the same f and gradient;
* AM-MGD with the linearised numerator (amopt's default) and with the paper's
  exact numerator.

The methods are printed best first, by the objective reached. Needs scikit-learn
to read the file (``pip install amopt[data]``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

DESCRIPTION = (
    "Rank GD, damped momentum (MGD), classical heavy ball and Nesterov momentum (textbook "
    "tuning from L and mu; with mu = 0, lr = 1/L and beta = 0.9), scipy's L-BFGS-B and "
    "AM-MGD (linearised and exact numerators) on LIBSVM logistic regression, the same "
    "number of iterations each (first-order methods at lr = 1/L unless tuned)."
)


def _runs(L: float, mu: float) -> list[tuple[str, str, dict]]:
    from amopt.bench._problem_set import textbook

    hb, nag = textbook("heavy-ball", L, mu), textbook("nesterov", L, mu)
    lr = 1.0 / L
    return [
        ("gd", "GD", {"lr": lr}),
        ("mgd", "MGD, damped (beta=0.9)", {"lr": lr, "beta": 0.9}),
        ("heavy-ball", f"heavy ball (beta={hb['beta']:.4g})", hb),
        ("nesterov", f"Nesterov (beta={nag['beta']:.4g})", nag),
        ("L-BFGS-B", "L-BFGS-B (scipy)", {}),
        ("am-mgd", "AM-MGD, linear numerator", {"lr": lr, "numerator": "linear"}),
        ("am-mgd", "AM-MGD, exact numerator", {"lr": lr, "numerator": "exact"}),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m amopt", description=DESCRIPTION)
    parser.add_argument(
        "--dataset",
        default="mushrooms",
        help="bundled name (mushrooms, a1a), registry name or file path (default: mushrooms)",
    )
    parser.add_argument("--maxiter", type=int, default=1000, help="iterations (default 1000)")
    parser.add_argument(
        "--l2",
        type=float,
        default=0.0,
        help="L2 term of the loss (default 0: the paper's setting); with l2 > 0, mu = l2 and "
        "heavy ball and Nesterov use their strongly convex tuning",
    )
    args = parser.parse_args(argv)

    import scipy.optimize

    from amopt.optimize.minimize import minimize
    from amopt.problems import LogisticRegression

    prob = LogisticRegression.from_libsvm(args.dataset, l2=args.l2)
    L, mu = prob.L, args.l2
    # the reference solution can take seconds (tens on the larger LIBSVM sets)
    print(f"computing f* of logistic regression on {args.dataset} (a reference solve) ...",
          flush=True)  # fmt: skip
    f_star = prob.f_star
    if mu > 0:
        tuning = f"mu = l2 = {mu:.4g}: heavy ball and Nesterov at their textbook tuning"
    else:
        tuning = "mu = 0 (not strongly convex): heavy ball and Nesterov at lr = 1/L, beta = 0.9"
    print(
        f"logistic regression on {args.dataset}: n={prob.n_samples}, d={prob.dim}, "
        f"L={L:.4g}, f*={f_star:.10f}, {args.maxiter} iterations; {tuning}"
    )
    x0 = np.zeros(prob.dim)
    rows = []
    for method, label, options in _runs(L, mu):
        t0 = time.perf_counter()
        if method == "L-BFGS-B":
            res = scipy.optimize.minimize(
                prob.value_and_grad, x0, jac=True, method="L-BFGS-B",
                options={"maxiter": args.maxiter, "gtol": 0.0},
            )  # fmt: skip
        else:
            res = minimize(
                prob, x0, method=method, options={**options, "maxiter": args.maxiter, "gtol": 0}
            )
        dt = time.perf_counter() - t0
        rows.append((float(res.fun), label, int(res.nit), dt))
    print(
        f"{'rank':>4s}  {'method':34s} {'f(x_T)':>14s} {'f(x_T) - f*':>12s} "
        f"{'iterations':>10s} {'time [s]':>9s}"
    )
    for rank, (fun, label, nit, dt) in enumerate(sorted(rows, key=lambda r: r[0]), 1):
        print(f"{rank:4d}  {label:34s} {fun:14.10f} {fun - f_star:12.3e} {nit:10d} {dt:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
