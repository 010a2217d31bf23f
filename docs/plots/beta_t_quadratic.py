"""beta_t of AM-MGD (both numerators) against MGD's fixed beta on a 3-D quadratic.

Drawn when the documentation is built (the index and "Adaptive Memory in one page").
"""

import matplotlib.pyplot as plt
import numpy as np

import amopt

A = np.diag([1.0, 4.0, 10.0])
b = np.array([1.0, -2.0, 0.5])
x_star = np.linalg.solve(A, b)


def fun(x):
    return 0.5 * x @ A @ x - b @ x


def jac(x):
    return A @ x - b


def distances(out):
    """A callback recording ||x_t - x*|| (one argument named intermediate_result: it is
    given an OptimizeResult, as in scipy)."""

    def record(intermediate_result):
        out.append(np.linalg.norm(intermediate_result.x - x_star))

    return record


runs = {  # label: (method, options, colour in both panels)
    "MGD (beta = 0.9)": ("mgd", {"beta": 0.9}, "k"),
    "AM-MGD, linear numerator": ("am-mgd", {"numerator": "linear"}, "C0"),
    "AM-MGD, exact numerator": ("am-mgd", {"numerator": "exact"}, "C1"),
}
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
for label, (method, opts, colour) in runs.items():
    errs = []
    res = amopt.minimize(
        fun, np.zeros(3), jac=jac, method=method,
        options={"lr": 0.1, "maxiter": 150, "gtol": 0, **opts}, callback=distances(errs),
    )  # fmt: skip
    if method == "am-mgd":
        ax1.plot(res.betas, lw=1, color=colour, label=label)
    ax2.semilogy(errs, lw=1, color=colour, label=label)
ax1.axhline(0.9, color="k", lw=0.8, ls=":", label="MGD, fixed beta = 0.9")
ax1.set(xlabel="iteration t", ylabel=r"$\beta_t$", ylim=(-0.05, 1.05))
ax1.legend(fontsize=7)
ax2.set(xlabel="iteration t", ylabel=r"$\|x_t - x^*\|$")
ax2.legend(fontsize=7)
fig.tight_layout()
