"""Device arrays in :func:`amopt.minimize`: one host transfer per step.

On a GPU every value the loop reads on the host (the objective, a gradient norm, the
finiteness of the iterate, the sums of the Adaptive Memory rule) waits for the
device's queue to drain. The loop for device arrays (CuPy, torch, any array-API
library other than NumPy and dask) therefore collects the 0-d device arrays of a step
and reads them with :func:`read`: one stack on the device, one copy to the host. The
dask loop (:mod:`amopt._lazy._session`) does the same with one ``dask.persist`` per
step.

:func:`to_device` moves the sampler's host index arrays (one per epoch) to the
device without waiting for the device's queue where the library allows it.
"""

from __future__ import annotations

from typing import Any

import array_api_compat
import numpy as np

from amopt.backends import to_numpy

__all__ = ["is_device", "read", "to_device"]


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


def read(xp: Any, values: list) -> list[float]:
    """The values of ``values`` (0-d arrays of ``xp``, or host numbers) as floats, in one transfer.

    Every device value is cast to float64 (float32 on a device without float64) and
    stacked; the stack is copied to the host once.
    """
    device = [v for v in values if not isinstance(v, _HOST)]
    if not device:
        return [float(v) for v in values]
    wide = xp.float64
    if getattr(getattr(device[0], "device", None), "type", None) == "mps":
        wide = xp.float32
    packed = xp.stack([v if v.dtype == wide else xp.astype(v, wide) for v in device])
    got = iter(_to_host_list(packed))
    return [float(v) if isinstance(v, _HOST) else next(got) for v in values]


def to_device(xp: Any, a: np.ndarray, like: Any) -> tuple[Any, Any]:
    """``a`` (host indices) as an array of ``xp`` on the device of ``like``.

    A copy from pageable host memory waits for the device's queue to drain; from
    pinned memory it is queued behind the work already submitted instead (torch and
    CuPy on CUDA). Returns the array and the host buffer the copy reads (``None``
    where the library keeps it alive): the caller holds the buffer until a later
    synchronisation has passed.
    """
    device = array_api_compat.device(like)
    if array_api_compat.is_torch_array(like) and getattr(device, "type", None) == "cuda":
        import torch

        host = torch.from_numpy(np.ascontiguousarray(a)).pin_memory()
        return host.to(device, non_blocking=True), None
    if array_api_compat.is_cupy_array(like):
        import cupy

        with device:
            pinned = cupy.cuda.alloc_pinned_memory(a.nbytes)
            host = np.frombuffer(pinned, a.dtype, a.size).reshape(a.shape)
            host[...] = a
            out = cupy.empty(a.shape, dtype=a.dtype)
            out.set(host, stream=cupy.cuda.get_current_stream())
            return out, pinned
    return xp.asarray(a, device=device), None
