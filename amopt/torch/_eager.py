"""``torch.compiler`` decorators applied on first traced use, not at ``import amopt.torch``.

``torch.compiler.disable`` and ``torch.compiler.assume_constant_result`` import
``torch._dynamo``, which imports most of the compiler and ``torch.distributed.fsdp``:
about 1.4 s of ``import amopt.torch`` (AMD EPYC Zen 4), paid by every user whether
or not they compile. A function registered here is decorated the first time a
``torch.compile`` trace looks it up as an attribute of this module (Dynamo is loaded
then anyway): Dynamo reads a module attribute missing from the module's ``__dict__``
with ``getattr``, which runs this module's ``__getattr__`` outside the trace. Eager
callers call the undecorated function and never load the compiler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["register"]

#: name -> (the ``torch.compiler`` decorator's name, the undecorated function)
_LAZY: dict[str, tuple[str, Callable[..., Any]]] = {}


def register(name: str, decorator: str, fn: Callable[..., Any]) -> None:
    """Make ``_eager.<name>`` be ``torch.compiler.<decorator>(fn)``, built on first use."""
    _LAZY[name] = (decorator, fn)


def __getattr__(name: str) -> Any:
    try:
        decorator, fn = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    decorated = getattr(torch.compiler, decorator)(fn)
    globals()[name] = decorated
    return decorated
