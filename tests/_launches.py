"""Counting the aten operations that are not views: on a GPU, the kernel launches."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class Launches(TorchDispatchMode):
    """aten operations that are not views, counted in ``count`` while the mode is on."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))
