r"""
A theory check: a bound against the iterates
============================================

The paper bounds the expected suboptimality of simplified AM-SGD (:math:`\lambda = 0`,
:math:`d_0 = 0`) on convex problems. :func:`amopt.problems.check_fixed_cap` runs the method
over several seeds on a problem with certified constants and compares the measured
:math:`E[f(\bar x_T) - f^*]` with the right-hand side of the fixed-cap bound

.. math::

    E[f(\bar x_T) - f^*] \le \frac{\|x_0 - x^*\|^2}{2\eta\epsilon T}
    + \eta G^2 \frac{2 + \epsilon}{2\epsilon^3}
    + \sigma_f^2 \frac{1 + \epsilon - \epsilon^2}{\epsilon^2},
    \qquad \epsilon = 1 - \beta_{\max}.

The problem is a planted Huber regression, whose minimiser and :math:`f^*` are known exactly.
"""

import matplotlib.pyplot as plt
import numpy as np

from amopt.problems import HuberRegression, check_fixed_cap

prob = HuberRegression.planted(200, 10, noise=0.1, seed=0)
checks = [check_fixed_cap(prob, T, seeds=4, beta_max=0.5) for T in (100, 300, 1000, 2000)]
for c in checks:
    print(c)

# %%
# Measured value (with its standard error over seeds) against the bound, per horizon T.
T = np.array([c.T for c in checks])
fig, ax = plt.subplots(figsize=(6.5, 4))
ax.errorbar(
    T,
    [c.measured for c in checks],
    yerr=[c.stderr for c in checks],
    marker="o",
    capsize=3,
    label=r"measured $E[f(\bar x_T) - f^*]$",
)
ax.plot(T, [c.bound for c in checks], marker="s", label="bound (fixed cap)")
ax.set(
    xscale="log",
    yscale="log",
    xlabel="T",
    ylabel="suboptimality",
    title=r"simplified AM-SGD, $\beta_{\max} = 0.5$",
)
ax.legend()
fig.tight_layout()
plt.show()
