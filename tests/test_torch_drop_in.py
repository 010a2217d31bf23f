"""``amopt.torch`` as a drop-in for ``torch.optim``: what a copied PyTorch setup expects.

Every keyword of ``torch.optim.AdamW`` / ``Adam`` / ``SGD`` is accepted at torch's
default and refused with a message naming it otherwise; another optimizer's
``state_dict`` is mapped (Adam's state into AM-Adam) or refused (SGD's into AMSGD);
``import amopt.torch`` loads neither the compiler nor ``torch.distributed.fsdp``;
and AMSGD's ``lr`` maps from ``torch.optim.SGD(momentum=m)`` by ``1/(1 - m)``.
References are torch's own optimizers and signatures.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import amopt  # noqa: E402


def _fresh_modules(code: str) -> list[str]:
    """The ``sys.modules`` names matching after ``code`` in a fresh interpreter."""
    script = textwrap.dedent(code) + "\nimport sys\nprint('\\n'.join(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    return out.stdout.split()


# --------------------------------------------------------------------------- import cost


def test_import_does_not_load_fsdp_nor_the_compiler():
    # torch.compiler.disable / assume_constant_result import torch._dynamo, which
    # imports torch.distributed.fsdp: ~1.4 s of every import before
    modules = _fresh_modules("import amopt.torch\nfrom amopt.torch import *")
    assert "amopt.torch" in modules
    assert "torch.distributed.fsdp" not in modules
    assert "torch._dynamo" not in modules


def test_eager_steps_load_no_torch_module_that_torch_optim_does_not():
    # constructing any torch.optim optimizer imports torch._dynamo (torch's own
    # add_param_group is wrapped by torch._compile._disable_dynamo); AM's steps add nothing
    steps = """
        import torch
        w = torch.nn.Parameter(torch.ones(4))
        for make in MAKERS:
            opt = make([w], lr=0.1)
            for _ in range(2):
                opt.zero_grad()
                (w ** 2).sum().backward()
                opt.step()
        """
    am = _fresh_modules(
        "from amopt.torch import AMSGD, AMAdamW\nMAKERS = (AMSGD, AMAdamW)\n"
        + textwrap.dedent(steps)
    )
    reference = _fresh_modules(
        "import amopt\nimport torch\nMAKERS = (torch.optim.SGD, torch.optim.AdamW)\n"
        + textwrap.dedent(steps)
    )
    extra = {m for m in set(am) - set(reference) if m.startswith("torch.")}
    assert not extra


def test_every_public_name_still_imports():
    import amopt.torch as amt
    from amopt.torch import _distributed, _fused, _triton  # noqa: F401

    for name in amt.__all__:
        assert callable(getattr(amt, name))
    for name in _distributed.__all__:
        assert hasattr(_distributed, name)
    for name in _fused.__all__:
        assert hasattr(_fused, name)
