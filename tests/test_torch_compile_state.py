"""The 0-d state of a compiled step with one scope for the whole group.

A global scope's members share one ``beta`` and one ``beta1_prod`` tensor, written at
every step; compiled with AOT autograd that write was seen lost (the product stayed 1,
the beta 0). Reference: the eager step of the same optimizer on the same gradients.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from amopt.torch import AMSGD, AMAdamW  # noqa: E402


@pytest.mark.parametrize("cls", [AMAdamW, AMSGD], ids=["AMAdamW", "AMSGD"])
def test_compiled_global_scope_updates_its_shared_state(cls):
    gen = torch.Generator().manual_seed(0)
    shapes = [(5,), (3, 2)]
    params = [
        torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64)) for s in shapes
    ]
    eager_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, eager = (cls(ps, lr=0.01, per_layer=False) for ps in (params, eager_params))
    torch._dynamo.reset()  # optimizers' steps compiled before would spend the recompile limit
    step = torch.compile(opt.step, fullgraph=True, backend="aot_eager")
    for _ in range(3):
        grads = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
        for ps in (params, eager_params):
            for p, g in zip(ps, grads, strict=True):
                p.grad = g.clone()
        step()
        eager.step()
        for p, q in zip(params, eager_params, strict=True):
            for key, value in eager.state[q].items():
                torch.testing.assert_close(opt.state[p][key], value, rtol=1e-12, atol=1e-12)
    if cls is AMAdamW:
        assert float(opt.state[params[0]]["beta1_prod"]) < 0.9  # three products of betas
