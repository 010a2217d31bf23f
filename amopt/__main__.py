"""``python -m amopt``: AM-MGD against GD and heavy ball on a bundled LIBSVM data set.

Runs logistic regression with ``lr = 1/L`` (the paper's Fig. 3 setting) on a
data set that ships with the package and prints the suboptimality reached by
each method. Needs scikit-learn to read the file (``pip install amopt[data]``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from amopt._minimize import minimize

RUNS = [
    ("gd", "GD", {}),
    ("mgd", "MGD (beta=0.9)", {"beta": 0.9}),
    ("am-mgd", "AM-MGD (exact numerator)", {"numerator": "exact"}),
    ("am-mgd", "AM-MGD (linearised numerator)", {"numerator": "linear"}),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m amopt",
        description="Compare GD, heavy ball and AM-MGD on LIBSVM logistic regression "
        "(lr = 1/L, lam = 0).",
    )
    parser.add_argument(
        "--dataset",
        default="mushrooms",
        help="bundled name (mushrooms, a1a), registry name or file path (default: mushrooms)",
    )
    parser.add_argument("--maxiter", type=int, default=1000, help="iterations (default 1000)")
    args = parser.parse_args(argv)

    from amopt.problems import LogisticRegression

    prob = LogisticRegression.from_libsvm(args.dataset)
    lr = 1.0 / prob.L
    f_star = prob.f_star
    print(
        f"logistic regression on {args.dataset}: n={prob.n_samples}, d={prob.dim}, "
        f"L={prob.L:.4g}, lr=1/L, f*={f_star:.10f}, {args.maxiter} iterations"
    )
    print(
        f"{'method':32s} {'f(x_T)':>14s} {'f(x_T) - f*':>12s} {'mean beta':>10s} {'time [s]':>9s}"
    )
    x0 = np.zeros(prob.dim)
    for method, label, extra in RUNS:
        t0 = time.perf_counter()
        res = minimize(
            prob,
            x0,
            method=method,
            options={"lr": lr, "maxiter": args.maxiter, "gtol": 0, **extra},
        )
        dt = time.perf_counter() - t0
        mean_beta = f"{np.mean(res.betas):10.3f}" if "betas" in res else f"{'-':>10s}"
        print(f"{label:32s} {res.fun:14.10f} {res.fun - f_star:12.3e} {mean_beta} {dt:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
