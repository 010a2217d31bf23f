"""amopt: Adaptive Memory momentum for NumPy, SciPy, CuPy and PyTorch.

Adaptive Memory (AM) replaces the fixed momentum coefficient of heavy-ball
and Adam-type methods by a coefficient ``beta_t`` computed in closed form at
every step from a two-plane proximal model of the loss (Topollai &
Choromanska, AISTATS 2026).

Public entry points
-------------------
minimize
    ``scipy.optimize.minimize``-shaped driver for every method.
scipy_method
    A callable usable as ``method=`` of ``scipy.optimize.minimize``.
show_options
    The options of each method and their defaults, as ``scipy.optimize.show_options``.
FiniteSum
    The protocol for stochastic (mini-batch) objectives.
am_momentum_step, am_adam_step, ...
    The pure array-API rules everything else is built on.
"""

from amopt.optimize.finite_sum import FiniteSum
from amopt.optimize.minimize import METHODS, STATUS_MESSAGES, minimize, scipy_method, show_options
from amopt.optimize.steps import (
    AdamState,
    AMAdamState,
    AMState,
    HeavyBallState,
    adam_init,
    adam_step,
    am_adam_beta,
    am_adam_init,
    am_adam_step,
    am_beta,
    am_momentum_init,
    am_momentum_step,
    apply_variant,
    gd_step,
    heavy_ball_init,
    heavy_ball_step,
)

__version__ = "0.1.0"

__all__ = [
    "AMAdamState",
    "AMState",
    "AdamState",
    "FiniteSum",
    "HeavyBallState",
    "METHODS",
    "STATUS_MESSAGES",
    "adam_init",
    "adam_step",
    "am_adam_beta",
    "am_adam_init",
    "am_adam_step",
    "am_beta",
    "am_momentum_init",
    "am_momentum_step",
    "apply_variant",
    "gd_step",
    "heavy_ball_init",
    "heavy_ball_step",
    "minimize",
    "scipy_method",
    "show_options",
]
