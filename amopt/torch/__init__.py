"""PyTorch optimizers with Adaptive Memory (AM) momentum.

First-class ``torch.optim.Optimizer`` subclasses that follow
``docs/algorithms.md`` step for step (they give the same iterates as the
array-API rules of :mod:`amopt` on the same gradients):

AMSGD
    SGD with Adaptive Memory momentum (the paper's AM-MSGD); one beta per param
    group by default. Its ``momentum`` (alias ``beta_max``) caps an adaptive beta,
    and its ``d`` is a damped average of gradients where ``torch.optim.SGD`` sums
    them: the lr of ``SGD(lr=a, momentum=m)`` maps to about ``a / (1 - m)`` (exact
    with the beta held at ``m``; measured in the ``AMSGD`` docstring).
AMAdamW
    AdamW with Adaptive Memory momentum (decoupled or proximal weight decay);
    one beta per parameter tensor by default.
AMAdam
    AM-Adam: the same with weight decay as an L2 term in the gradient.
amsgd, am_adamw
    The functional forms, as ``torch.optim.sgd`` / ``torch.optim.adam`` provide.

Every optimizer exposes :meth:`~AMSGD.latest_betas` (the betas of the last step
as device tensors, cheap enough to log every step). By default a step runs the
fastest implementation for the parameters' device and dtype: fused CPU kernels
for float32/float64 (two passes over memory per step, built by ``pip install`` or
with the system C compiler on first use; see ``amopt.torch._fused``), Triton kernels on CUDA
(``amopt.torch._triton``), the foreach implementation otherwise; ``fused`` and
``foreach`` choose one explicitly. Requires the ``torch`` extra:
``pip install amopt[torch]``.

Copied ``torch.optim`` configurations run: every keyword of ``torch.optim.AdamW``,
``Adam`` and ``SGD`` is accepted at torch's default (``amsgrad``, ``differentiable``,
``dampening``, ``nesterov`` at no other value: a ``ValueError`` says why), and a
``torch.optim.Adam``/``AdamW`` state dict loads into ``AMAdam``/``AMAdamW`` (with a
warning; see their ``load_state_dict``). Importing the package loads neither
``torch._dynamo`` nor ``torch.distributed.fsdp`` (about 1.4 s): ``torch.compile``
and torch's own optimizer constructor load them when they are used.
"""

import torch as _torch

from amopt.torch import _common
from amopt.torch._amadamw import AMAdam, AMAdamW, am_adamw
from amopt.torch._amsgd import AMSGD, amsgd

__all__ = ["AMAdam", "AMAdamW", "AMSGD", "am_adamw", "amsgd"]

if _torch.cuda.is_available():
    # the Triton kernels are the default on CUDA: resolve them now, since a first
    # attempt made inside a torch.compile trace cannot import them (Dynamo skips importlib)
    _common.triton_module()
