"""Beta of the torch optimizers over the float32 range: scale-invariant where the rule is.

At ``lam = 0`` (and no weight decay) the AM rules depend only on the direction of the
data: AM-MSGD's ``beta = <g,g> / |d-g|^2``, and AM-Adam's ``N / D`` with ``g``, ``d`` and
the preconditioner ``p`` scaled together. Scaling the gradients by ``s`` must then leave
beta unchanged, also where ``g * g`` underflows (``|g|`` below about 1e-19) or overflows
(above about 1e19) in float32, which used to reset beta to 0: the single-tensor and
foreach paths now square in float64 (AMSGD) or form every AM-Adam term as a ratio of
size O(1) times ``g``, ``d`` or ``d - g`` (never ``g * g``).

Tolerance, from the conditioning of the two-step problems below. The float32 data at
scale ``s`` is ``fl(s g)``: each entry differs from ``s fl(g)`` by at most one rounding,
``u = 2^-24`` relative. Beta is a ratio of two sums of squares of such entries, the
denominator's of ``v = d - g``, whose relative perturbation is at most ``u (1 + kappa)``
entrywise with ``kappa = (|d| + |g|) / |d - g|``; the problems keep ``d`` and ``g`` apart
(``kappa`` about 1 to 3), so the input roundings move beta by at most ``2 (2 + 2 (2 +
kappa)) u``, about ``20 u``. The float32 arithmetic of the step adds a few roundings per
term and per sum (the sums run over 256 entries: a few ``u`` more) on each side of the
comparison. ``64 u`` (4e-6) bounds it all; the defects are far larger (beta = 0, or
relative errors of 1e-5 and more from denormal squares at ``s = 1e-20``).
"""

from __future__ import annotations

import pytest
import torch

from amopt.torch import AMSGD, AMAdamW

N = 256
U = 2.0**-24
RTOL = 64 * U
SCALES = [1e-25, 1e-20, 1e20, 1e25]
#: ``1 - beta2 = 2^-42``: ``exp_avg_sq = 2^-42 g^2`` stays finite in float32 up to
#: ``|g| ~ 4e25``, and ``sqrt(v / (1 - beta2^t))`` is ``|g|``-sized.
BETA2 = 1.0 - 2.0**-42
PATHS = pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
SCOPES = pytest.mark.parametrize("per_layer", [False, True], ids=["global", "per-layer"])


def _directions(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float64 data of scale 0.1: entries of ``g1`` in +-[0.05, 0.2] and a noise.

    At ``s = 1e-20`` the entries are near 1e-21: their float32 squares are denormal
    (precision near 1e-3 relative), which is what the old float32 squares gave.
    """
    gen = torch.Generator().manual_seed(seed)
    mag = torch.empty(N, dtype=torch.float64).uniform_(0.05, 0.2, generator=gen)
    sign = torch.randint(0, 2, (N,), generator=gen, dtype=torch.float64) * 2 - 1
    return mag * sign, 0.1 * torch.randn(N, generator=gen, dtype=torch.float64)


def _beta_after_two_steps(cls, kwargs, grads, scale):
    """The beta of the second step on float32 data: gradients ``fl(scale * g)``."""
    x = torch.nn.Parameter(torch.zeros(N, dtype=torch.float32))
    opt = cls([x], **kwargs)
    for g in grads:
        x.grad = (scale * g).to(torch.float32)
        opt.step()
    beta = opt.latest_betas()[0][0]
    assert beta.dtype == torch.float32
    return float(beta)


def _amsgd(scale, foreach, per_layer):
    g1, noise = _directions()
    # d = g1 after the first step; v = d - g2 = 0.7 g1 - 0.5 noise: kappa about 2
    grads = [g1, 0.3 * g1 + 0.5 * noise]
    kwargs = {"lr": 1e-3, "lam": 0.0, "per_layer": per_layer, "foreach": foreach}
    return _beta_after_two_steps(AMSGD, kwargs, grads, scale)


def _am_adamw(scale, foreach, per_layer, *, eps_unit):
    g1, noise = _directions(1)
    # d = 0.1 g1 after the first step (beta = beta1_max); d - g2 = 0.4 g1 - 0.2 noise
    grads = [g1, -0.3 * g1 + 0.2 * noise]
    kwargs = {
        "lr": 1e-3,
        "betas": (0.9, BETA2),
        "eps": eps_unit * scale,
        "weight_decay": 0.0,
        "lam": 0.0,
        "per_layer": per_layer,
        "foreach": foreach,
    }
    return _beta_after_two_steps(AMAdamW, kwargs, grads, scale)


@SCOPES
@PATHS
@pytest.mark.parametrize("scale", SCALES)
def test_amsgd_beta_is_scale_invariant(scale, foreach, per_layer):
    ref = _amsgd(1.0, foreach, per_layer)
    assert 0.1 < ref < 0.8
    assert _amsgd(scale, foreach, per_layer) == pytest.approx(ref, rel=RTOL)


@SCOPES
@PATHS
@pytest.mark.parametrize("scale", SCALES)
def test_am_adamw_beta_is_scale_invariant_with_eps_dominated_p(scale, foreach, per_layer):
    """``eps = 2^40 s``: ``p = c eps`` at every scale (``sqrt(v_hat) ~ |g|`` is below
    half an ulp of ``eps``), whether the float32 ``exp_avg_sq`` holds ``2^-42 g^2`` or
    underflows to 0: below ``|g| ~ 1e-17`` it cannot hold it, as in ``torch.optim.Adam``
    the state itself limits the range where ``p`` follows ``|g|``."""
    ref = _am_adamw(1.0, foreach, per_layer, eps_unit=2.0**40)
    assert 0.1 < ref < 0.8
    got = _am_adamw(scale, foreach, per_layer, eps_unit=2.0**40)
    assert got == pytest.approx(ref, rel=RTOL)


@SCOPES
@PATHS
@pytest.mark.parametrize("scale", [1e20, 1e25])
def test_am_adamw_beta_is_scale_invariant_with_adam_p(scale, foreach, per_layer):
    """``p = c (eps + sqrt(v_hat))`` with ``sqrt(v_hat) ~ |g|``: ``v_hat ~ g^2`` itself
    overflows float32 here, so ``p`` must be formed as ``sqrt(v) / sqrt(1 - beta2^t)``."""
    ref = _am_adamw(1.0, foreach, per_layer, eps_unit=1e-8)
    assert 0.1 < ref < 0.8
    got = _am_adamw(scale, foreach, per_layer, eps_unit=1e-8)
    assert got == pytest.approx(ref, rel=RTOL)
