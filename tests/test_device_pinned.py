"""CuPy's page-locked host buffers outlive the asynchronous copies queued on them.

CuPy's pinned memory pool hands a freed buffer out again at once, whatever copies are
still queued on it, and ``cupy.asarray`` of a NumPy array stages through that pool: a
device-to-host read that a loop drops unread (a run that stops before it waits for its
last read) or a host-to-device copy of sampler indices would then land in, or read
from, memory already given to another copy. ``amopt.backends.device`` holds each such
buffer until the event recorded after its copy has passed. Without a GPU, CuPy is
stood in for by a module whose copies complete when the test says so.
"""

from __future__ import annotations

import sys
import types
import weakref

import numpy as np
import pytest

from amopt.backends import device as _device


class _Event:
    """A CUDA event that has passed once the test sets ``done``."""

    def __init__(self) -> None:
        self.done = False

    def synchronize(self) -> None:
        self.done = True


class _Stream:
    def __init__(self) -> None:
        self.events: list[_Event] = []

    def record(self) -> _Event:
        self.events.append(_Event())
        return self.events[-1]


class _Device:
    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _Buffer(bytearray):
    """A pinned buffer (weak-referenceable, so that the test sees when it is freed)."""


@pytest.fixture
def fake_cupy(monkeypatch):
    """A ``cupy`` module with just what ``_device`` calls; its arrays are NumPy inside."""
    cupy = types.ModuleType("cupy")
    stream = _Stream()
    buffers: list[weakref.ref] = []

    class ndarray:  # noqa: N801 - the name array_api_compat looks for
        def __init__(self, values: np.ndarray) -> None:
            self.values = np.asarray(values)
            self.device = _Device()
            self.dtype, self.shape = self.values.dtype, self.values.shape
            self.nbytes, self.size = self.values.nbytes, self.values.size

        def set(self, host: np.ndarray, stream: object = None) -> None:
            self.values = host.copy()

    def alloc_pinned_memory(nbytes: int) -> _Buffer:
        buf = _Buffer(nbytes)
        buffers.append(weakref.ref(buf))
        return buf

    def asnumpy(a: ndarray, stream: object = None, out: np.ndarray | None = None,
                blocking: bool = True) -> np.ndarray:  # fmt: skip
        assert out is not None and not blocking  # the asynchronous form is what is used
        out[...] = a.values
        return out

    cupy.ndarray = ndarray
    cupy.asnumpy = asnumpy
    cupy.empty = lambda shape, dtype: ndarray(np.empty(shape, dtype))
    cupy.cuda = types.SimpleNamespace(
        alloc_pinned_memory=alloc_pinned_memory, get_current_stream=lambda: stream
    )
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(_device, "_IN_FLIGHT", [])
    # the array namespace the loop passes in: stack and cast on the NumPy inside
    xp = types.SimpleNamespace(
        float64=np.float64,
        stack=lambda vs: ndarray(np.stack([v.values for v in vs])),
        astype=lambda v, dt: ndarray(v.values.astype(dt)),
    )
    return types.SimpleNamespace(module=cupy, xp=xp, stream=stream, buffers=buffers)


def _alive(buffers: list[weakref.ref]) -> list[bool]:
    return [ref() is not None for ref in buffers]


def test_a_read_dropped_unread_keeps_its_buffer_until_its_copy_has_run(fake_cupy):
    xp, arr = fake_cupy.xp, fake_cupy.module.ndarray
    pending = _device.start_read(xp, [arr(np.float64(2.5)), 1.0, arr(np.float64(-3.0))])
    del pending  # the loop stopped without waiting for this read
    assert _alive(fake_cupy.buffers) == [True]
    # a later read lets go of nothing while the first copy is still queued
    second = _device.start_read(xp, [arr(np.float64(7.0))])
    assert _alive(fake_cupy.buffers) == [True, True]
    fake_cupy.stream.events[0].done = True
    third = _device.start_read(xp, [arr(np.float64(8.0))])
    assert _alive(fake_cupy.buffers) == [False, True, True]
    # a read that is waited for still gives its values (and passes its event)
    assert second.values() == [7.0]
    assert third.values() == [8.0]
    _device.start_read(xp, [arr(np.float64(9.0))])
    assert _alive(fake_cupy.buffers) == [False, False, False, True]


def test_a_read_gives_the_values_in_the_order_given(fake_cupy):
    xp, arr = fake_cupy.xp, fake_cupy.module.ndarray
    pending = _device.start_read(xp, [arr(np.float32(0.5)), 4, arr(np.float64(np.inf))])
    assert pending.values() == [0.5, 4.0, float("inf")]


def test_index_copies_keep_their_buffer_until_the_copy_has_run(fake_cupy):
    like = fake_cupy.module.ndarray(np.zeros(3))
    blocks = [np.arange(5) + 10 * k for k in range(3)]
    outs = [_device.to_device(fake_cupy.xp, blocks[0], like)]
    outs.append(_device.to_device(fake_cupy.xp, blocks[1], like))
    assert _alive(fake_cupy.buffers) == [True, True]
    fake_cupy.stream.events[1].done = True  # the second copy ran, the first not yet
    outs.append(_device.to_device(fake_cupy.xp, blocks[2], like))
    assert _alive(fake_cupy.buffers) == [True, False, True]
    for out, block in zip(outs, blocks, strict=True):
        np.testing.assert_array_equal(out.values, block)
