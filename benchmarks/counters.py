"""The two counters of the harness and the tests: aten operations, and reads to the host.

On a GPU every aten operation that is not a view is a kernel launch, and every value
read back to Python a synchronisation; both are counted here on any tensors, CPU ones
included, so that the CPU stand-ins of the GPU targets (:mod:`benchmarks.standins`)
and the tests count the same things the same way:

* :class:`OpCounter`: every aten operation dispatched while it is on (a
  ``TorchDispatchMode``), in order; views apart. A ``watch`` callable sees each
  operation with its arguments and result, for what a test or a row looks at beyond
  the count (the bytes moved: :class:`Traffic`; integer outputs; copies to the device).
* :class:`HostReads`: an :class:`OpCounter` that also counts the reads to the host:
  the operations that hand a tensor's value to Python (:data:`READ_OPS`: ``item()``,
  ``float()``, ``bool()``, ``equal``, ``nonzero``'s data-dependent size) and the
  ``Tensor`` methods that copy to the host (:data:`HOST_METHODS`; ``to`` only with a
  CPU device); a read made inside another one counts once.

torch is imported by this module: import it where torch is there.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HOST_METHODS", "LOCAL_SCALAR", "READ_OPS", "HostReads", "OpCounter", "Traffic"]

#: the aten operation that reads a value to Python (item, float, bool, int, format)
LOCAL_SCALAR = "aten._local_scalar_dense.default"
#: the aten operations (by overload packet) whose result is a tensor's value on the host,
#: or whose output size is (a synchronisation on a GPU)
READ_OPS = ("aten._local_scalar_dense", "aten.item", "aten.equal", "aten.is_nonzero",
            "aten.nonzero")  # fmt: skip
#: the Tensor methods counted as reads to the host (a device-to-host copy on a GPU)
HOST_METHODS = ("tolist", "numpy", "__array__", "cpu", "to")

#: ``watch(func, args, kwargs, out)``: called after each operation an OpCounter sees
Watch = Callable[[Any, tuple, dict, Any], None]


class OpCounter(TorchDispatchMode):
    """The aten operations dispatched while it is entered.

    ``calls`` holds them in order (the ``OpOverload`` objects), ``sequence`` their
    names in order, ``ops`` the names counted; ``views`` counts those that are views,
    ``kernel_ops`` the others (the ones a GPU launches). ``watch``, if given, is called
    as ``watch(func, args, kwargs, out)`` after each operation.

    Examples
    --------
    >>> x = torch.arange(4.0)
    >>> with OpCounter() as c:
    ...     y = (x * 2).view(2, 2).sum()
    >>> c.sequence
    ['aten.mul.Tensor', 'aten.view.default', 'aten.sum.default']
    >>> c.total_ops, c.views, c.kernel_ops
    (3, 1, 2)
    """

    def __init__(self, watch: Watch | None = None) -> None:
        super().__init__()
        self.calls: list[Any] = []
        self.watch = watch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        self.calls.append(func)
        self._seen(func)
        out = func(*args, **kwargs)
        if self.watch is not None:
            self.watch(func, args, kwargs, out)
        return out

    def _seen(self, func: Any) -> None:
        """What a subclass counts at an operation, before it runs."""

    @property
    def sequence(self) -> list[str]:
        """The operations' names, in the order they ran."""
        return [str(f) for f in self.calls]

    @property
    def ops(self) -> Counter[str]:
        """Each operation's name and how many times it ran."""
        return Counter(self.sequence)

    def packets(self) -> Counter[str]:
        """The operations counted by overload packet (``"_foreach_add_"``, ``"view"``)."""
        return Counter(f.overloadpacket.__name__ for f in self.calls)

    @property
    def total_ops(self) -> int:
        return len(self.calls)

    @property
    def views(self) -> int:
        return sum(1 for f in self.calls if getattr(f, "is_view", False))

    @property
    def kernel_ops(self) -> int:
        """The operations that are not views (a view launches no kernel on a GPU)."""
        return self.total_ops - self.views

    def reset(self) -> None:
        self.calls.clear()


def _to_host(args: tuple, kwargs: dict) -> bool:
    """Whether ``Tensor.to(*args, **kwargs)`` names the CPU as its device."""
    for value in (*args, kwargs.get("device")):
        if isinstance(value, str) and value.split(":")[0] == "cpu":
            return True
        if isinstance(value, torch.device) and value.type == "cpu":
            return True
    return False


class HostReads(OpCounter):
    """Reads to the host (and, as :class:`OpCounter`, the operations) while it is entered.

    ``syncs`` counts the reads: each operation of :data:`READ_OPS` and each call of a
    method of :data:`HOST_METHODS` (``to`` only with a CPU device), those made inside
    another such call not counted again (``np.asarray(t)`` calls ``t.__array__``, which
    calls ``t.numpy()``: one read). ``sync_sites`` says which of them ran. ``forbid``:
    ``True``, the first read raises an ``AssertionError`` naming it instead (where it is
    made); a collection of sites (``LOCAL_SCALAR``, ``"tolist"``, ...), those reads only.

    Examples
    --------
    >>> x = torch.arange(4.0)
    >>> with HostReads() as c:
    ...     y = (x * 2).sum()
    ...     v = float(y), y.tolist()
    >>> c.total_ops, c.syncs, dict(c.sync_sites)
    (3, 2, {'aten._local_scalar_dense.default': 1, 'tolist': 1})
    """

    def __init__(
        self, watch: Watch | None = None, *, forbid: bool | Iterable[str] = False
    ) -> None:
        super().__init__(watch)
        self.forbid: bool | frozenset[str] = forbid if forbid is True else frozenset(forbid or ())
        self.sync_sites: Counter[str] = Counter()
        self._local = threading.local()
        self._saved: dict[str, Any] = {}

    @property
    def syncs(self) -> int:
        return sum(self.sync_sites.values())

    def reset(self) -> None:
        super().reset()
        self.sync_sites.clear()

    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)

    def _read(self, site: str) -> None:
        if self.forbid is True or site in self.forbid:  # type: ignore[operator]
            raise AssertionError(f"a tensor value was read on the host: {site}")
        self.sync_sites[site] += 1

    def _seen(self, func: Any) -> None:
        if self._depth() == 0 and str(func.overloadpacket) in READ_OPS:
            self._read(str(func))

    def _wrap(self, name: str, method: Callable) -> Callable:
        counter = self

        def wrapper(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if counter._depth() == 0 and (name != "to" or _to_host(args, kwargs)):
                counter._read(name)
            counter._local.depth = counter._depth() + 1
            try:
                return method(tensor, *args, **kwargs)
            finally:
                counter._local.depth -= 1

        wrapper.__name__ = name
        return wrapper

    def __enter__(self) -> HostReads:
        for name in HOST_METHODS:
            self._saved[name] = torch.Tensor.__dict__.get(name)
            setattr(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name)))
        try:
            super().__enter__()
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._restore()

    def _restore(self) -> None:
        for name, saved in self._saved.items():
            if saved is None:
                delattr(torch.Tensor, name)  # the method is inherited from TensorBase
            else:
                setattr(torch.Tensor, name, saved)
        self._saved.clear()


class Traffic(OpCounter):
    """Bytes moved and full-size operations of the aten operations run while entered.

    Every operation dispatched counts (``total_ops``); one that is not a view adds the
    sizes of its tensor inputs and outputs to ``bytes`` (0-d tensors aside: on a GPU
    they are kernel arguments, not traffic) and, when one of them holds at least
    ``full`` elements, counts in ``full_ops``. A tensor given twice to one operation
    (``v @ v``) counts once: it is read once.

    Examples
    --------
    >>> x = torch.ones(1000, dtype=torch.float64)
    >>> with Traffic(full=1000) as t:
    ...     y = 2.0 * x
    >>> t.bytes, t.full_ops
    (16000, 1)
    """

    def __init__(self, full: int) -> None:
        super().__init__(watch=self._count)
        self.full = full
        self.full_ops = self.bytes = 0

    def _count(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        from torch.utils._pytree import tree_leaves

        if func._schema.is_mutable is False and func.is_view:
            return
        seen: set[int] = set()
        big = False
        for t in tree_leaves((args, kwargs, out)):
            if isinstance(t, torch.Tensor) and t.ndim > 0 and id(t) not in seen:
                seen.add(id(t))
                self.bytes += t.numel() * t.element_size()
                big = big or t.numel() >= self.full
        self.full_ops += big
