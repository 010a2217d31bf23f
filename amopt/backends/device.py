"""Device arrays in :func:`amopt.minimize`: one host transfer per step.

On a GPU every value the loop reads on the host (the objective, a gradient norm, the
finiteness of the iterate, the sums of the Adaptive Memory rule) waits for the
device's queue to drain. The loop for device arrays (CuPy, torch, any array-API
library other than NumPy and dask) therefore collects the 0-d device arrays of a step
and reads them with :func:`read`: one stack on the device, one copy to the host. The
dask loop (:mod:`amopt.backends.dask._session`) does the same with one ``dask.persist`` per
step.

Where the device runs ahead of the host (torch CUDA tensors, CuPy arrays:
:func:`asynchronous`), :func:`start_read` queues that copy into page-locked host
memory behind the work already submitted and returns at once; the loop waits for it
(:meth:`Pending.values`) after it has queued the next iteration, so that the host's
work overlaps the device's instead of adding to it.

:func:`to_device` moves the sampler's host index arrays (one per epoch) to the
device without waiting for the device's queue where the library allows it.

Both copies go through page-locked host buffers. torch's caching host allocator records
an event for each asynchronous copy and does not hand a buffer out again before it has
passed; CuPy's pinned memory pool hands a freed buffer out at once, whatever copies are
still queued on it (and ``cupy.asarray`` of a NumPy array stages through that pool), so
the CuPy buffers are held here (:func:`_hold`) until their copy's event has passed: a
read that a loop drops unread (a run that stops before waiting for its last read) would
otherwise land in memory already given to another copy.
"""

from __future__ import annotations

import threading
from typing import Any

import array_api_compat
import numpy as np

from amopt.backends import to_numpy

__all__ = ["Pending", "asynchronous", "is_device", "read", "start_read", "to_device"]


def is_device(arrays: Any) -> bool:
    """True when ``arrays`` are neither NumPy nor dask arrays (their values live elsewhere)."""
    return not any(isinstance(a, np.ndarray) or array_api_compat.is_dask_array(a) for a in arrays)


#: values already on the host (the loop's floats, NumPy scalars)
_HOST = (float, int, np.generic, np.ndarray)


def _to_host_list(packed: Any) -> list[float]:
    """The values of a 1-D device array as Python floats: one transfer."""
    if array_api_compat.is_torch_array(packed):
        return packed.tolist()  # one copy (one synchronisation on a GPU)
    return to_numpy(packed).tolist()


def asynchronous(arrays: Any) -> bool:
    """True when the values of ``arrays`` are computed by a device queue that runs
    ahead of the host: torch tensors on a CUDA (or ROCm) device, CuPy arrays."""
    if not arrays:
        return False
    a = arrays[0]
    if array_api_compat.is_torch_array(a):
        return a.device.type == "cuda"
    return array_api_compat.is_cupy_array(a)


class Pending:
    """The values of :func:`start_read`, on their way to the host.

    :meth:`values` waits for the copy (the one synchronisation) and returns the
    values as Python floats, in the order given.
    """

    __slots__ = ("_given", "_packed", "_host", "_event", "_keep")

    def __init__(self, given: list, packed: Any, host: Any, event: Any, keep: Any = None):
        self._given, self._packed, self._host, self._event, self._keep = (
            given, packed, host, event, keep
        )  # fmt: skip

    def values(self) -> list[float]:
        """The floats of the values given to :func:`start_read`; waits for the copy."""
        given = self._given
        if self._packed is None:
            return [float(v) for v in given]
        if self._event is None:  # a synchronous library: the copy is made now
            host = _to_host_list(self._packed)
        else:
            self._event.synchronize()
            host = self._host.tolist()
        self._packed = self._host = self._event = self._keep = None
        got = iter(host)
        return [float(v) if isinstance(v, _HOST) else next(got) for v in given]


def _pack(xp: Any, device: list) -> Any:
    """``device`` (0-d arrays) cast to float64 (float32 on MPS) and stacked: one array."""
    wide = xp.float64
    if getattr(getattr(device[0], "device", None), "type", None) == "mps":
        wide = xp.float32
    return xp.stack([v if v.dtype == wide else xp.astype(v, wide) for v in device])


def start_read(xp: Any, values: list) -> Pending:
    """Start reading ``values`` (0-d arrays of ``xp``, or host numbers) to the host.

    On an :func:`asynchronous` device the stack of the device values is copied into
    page-locked host memory on the current stream, behind the work queued so far,
    without waiting; elsewhere the copy is made when :meth:`Pending.values` is called.
    """
    device = [v for v in values if not isinstance(v, _HOST)]
    if not device:
        return Pending(values, None, None, None)
    packed = _pack(xp, device)
    if not asynchronous([packed]):
        return Pending(values, packed, None, None)
    if array_api_compat.is_torch_array(packed):
        import torch

        host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        host.copy_(packed, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(packed.device))
        return Pending(values, packed, host, event)
    import cupy

    with packed.device:
        pinned = cupy.cuda.alloc_pinned_memory(packed.nbytes)
        host = np.frombuffer(pinned, packed.dtype, packed.size)
        stream = cupy.cuda.get_current_stream()
        try:
            cupy.asnumpy(packed, stream=stream, out=host, blocking=False)
        except TypeError:  # CuPy < 13 copies synchronously only: read when waited for
            return Pending(values, packed, None, None)
        event = stream.record()
    _hold(pinned, event)
    return Pending(values, packed, host, event, pinned)


def read(xp: Any, values: list) -> list[float]:
    """The values of ``values`` (0-d arrays of ``xp``, or host numbers) as floats, in one transfer.

    Every device value is cast to float64 (float32 on a device without float64) and
    stacked; the stack is copied to the host once.
    """
    device = [v for v in values if not isinstance(v, _HOST)]
    return Pending(values, _pack(xp, device) if device else None, None, None).values()


class Copying:
    """A CuPy page-locked host buffer that an asynchronous copy reads or writes, kept
    alive for it; :attr:`done` is True once the copy has run (the buffer may then go)."""

    __slots__ = ("_buffer", "_event")

    def __init__(self, buffer: Any, event: Any):
        self._buffer, self._event = buffer, event

    @property
    def done(self) -> bool:
        return bool(self._event.done)


#: the CuPy pinned buffers whose copies may still be queued (see the module's docstring)
_IN_FLIGHT: list[Copying] = []
#: runs in several threads share the list: its pruning and appending go together
_IN_FLIGHT_LOCK = threading.Lock()


def _hold(buffer: Any, event: Any) -> None:
    """Keep ``buffer`` alive until ``event`` (recorded after its copy) has passed, and let
    go of the buffers held so far whose copies are done."""
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT[:] = [c for c in _IN_FLIGHT if not c.done]
        _IN_FLIGHT.append(Copying(buffer, event))


def to_device(xp: Any, a: np.ndarray, like: Any) -> Any:
    """``a`` (host indices) as an array of ``xp`` on the device of ``like``.

    A copy from pageable host memory waits for the device's queue to drain; from
    pinned memory it is queued behind the work already submitted instead (torch and
    CuPy on CUDA).
    """
    device = array_api_compat.device(like)
    if array_api_compat.is_torch_array(like) and getattr(device, "type", None) == "cuda":
        import torch

        host = torch.from_numpy(np.ascontiguousarray(a)).pin_memory()
        return host.to(device, non_blocking=True)
    if array_api_compat.is_cupy_array(like):
        import cupy

        with device:
            pinned = cupy.cuda.alloc_pinned_memory(a.nbytes)
            host = np.frombuffer(pinned, a.dtype, a.size).reshape(a.shape)
            host[...] = a
            out = cupy.empty(a.shape, dtype=a.dtype)
            stream = cupy.cuda.get_current_stream()
            out.set(host, stream=stream)
            _hold(pinned, stream.record())
            return out
    return xp.asarray(a, device=device)
