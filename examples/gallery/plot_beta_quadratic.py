r"""
beta_t against fixed momentum on an ill-conditioned quadratic
=============================================================

AM-MGD computes its momentum coefficient :math:`\beta_t` at every step from a two-plane
model of the loss; MGD uses a fixed :math:`\beta`. On a quadratic
:math:`f(x) = \tfrac12 x^\top A x - b^\top x` with condition number :math:`10^2` (a log-spaced
spectrum, :class:`amopt.problems.Quadratic`), we run both AM numerators against the fixed
:math:`\beta \in \{0.5, 0.9, 0.99\}`, all at the step size :math:`\eta = 1/L`.
"""

import matplotlib.pyplot as plt
import numpy as np

import amopt
from amopt.problems import Quadratic

prob = Quadratic.from_spectrum(100, cond=1e2, spacing="log", seed=0)
fun, jac = prob.fun, prob.grad
x0 = np.zeros(prob.dim)
common = {"lr": 1 / prob.L, "maxiter": 1000, "gtol": 0}
settings = {
    "MGD, beta = 0.5": ("mgd", {"beta": 0.5}),
    "MGD, beta = 0.9": ("mgd", {"beta": 0.9}),
    "MGD, beta = 0.99": ("mgd", {"beta": 0.99}),
    "AM-MGD, linear": ("am-mgd", {"numerator": "linear"}),
    "AM-MGD, exact": ("am-mgd", {"numerator": "exact"}),
}


def recorder(out):
    """A callback that appends f(x_t) - f* to ``out``.

    A callback whose one argument is named ``intermediate_result`` is given an
    ``OptimizeResult`` (as in scipy); otherwise it is given the iterate.
    """

    def record(intermediate_result):
        out.append(intermediate_result.fun - prob.f_star)

    return record


runs, gaps = {}, {}
for name, (method, opts) in settings.items():
    gaps[name] = []
    runs[name] = amopt.minimize(
        fun, x0, jac=jac, method=method, options={**common, **opts}, callback=recorder(gaps[name])
    )

# %%
# The final gaps :math:`f(x_T) - f^*` after 1000 iterations:
for name, res in runs.items():
    print(f"{name:22s} f - f* = {res.fun - prob.f_star:.3e}")

# %%
# :math:`\beta_t` of the two AM runs (``res.betas``), and the gap along the way
# (recorded with a ``callback``).

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
for name in ("AM-MGD, linear", "AM-MGD, exact"):
    ax1.plot(runs[name].betas, label=name, lw=1)
for beta in (0.5, 0.9, 0.99):
    ax1.axhline(beta, color="k", lw=0.6, ls=":")
ax1.set(xlabel="iteration t", ylabel=r"$\beta_t$", title="momentum coefficient")
ax1.legend()

for name, gap in gaps.items():
    # f* is known to float64 rounding: below about 1e-13 the gap is rounding noise
    ax2.semilogy(np.maximum(gap, 1e-14), label=name, lw=1)
ax2.set(xlabel="iteration t", ylabel=r"$f(x_t) - f^*$", title="suboptimality")
ax2.legend(fontsize=8)
fig.tight_layout()
plt.show()
