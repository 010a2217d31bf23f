"""A SciPy CSR design matrix on a device: torch sparse CSR (CPU, CUDA) or ``cupyx.scipy.sparse``.

The full products :math:`Xw` and :math:`X^\\top r` run as the library's sparse
matrix products on a CSR copy of :math:`X` and one of :math:`X^\\top`. Mini-batch
rows are gathered on the device without reading anything back to the host: the
``m`` selected rows are read into an ``(m, k_max)`` block (``k_max`` the largest
row length, shorter rows padded with zeros), so the work and the output sizes
are known from shapes alone. Where the rows have nearly equal lengths
(``n * k_max <= 2 nnz``, as in most LIBSVM sets) the padded ``(n, k_max)``
block is stored and a batch is two row gathers from it; otherwise the block is
built from the CSR arrays per batch. When that block would be larger than the matrix
(``m * k_max > nnz``), the batch is evaluated through the full products instead
(:math:`(Xw)_S` and :math:`X^\\top` of the batch residual scattered to length
``n``), which costs about two passes over the matrix and no synchronisation
either.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["device_indices", "device_library", "DeviceCSR"]


def device_library(x: Any) -> str | None:
    """``"torch"`` or ``"cupy"`` for arrays a SciPy CSR design can be copied to, else None."""
    import array_api_compat

    if array_api_compat.is_torch_array(x):
        return "torch"
    if array_api_compat.is_cupy_array(x):
        return "cupy"
    return None


class _Structure:
    """The index arrays of :math:`X` and :math:`X^\\top` on one device (shared by every dtype)."""

    def __init__(self, host: sp.csr_matrix, hostT: sp.csr_matrix, lib: str, device: Any):
        self.lib, self.device = lib, device
        self.shape = tuple(int(s) for s in host.shape)
        self.nnz = int(host.nnz)
        row_nnz = np.diff(host.indptr)
        self.kmax = max(int(row_nnz.max()), 1)
        if lib == "torch":
            import torch

            def up(a: np.ndarray) -> Any:
                return torch.as_tensor(np.ascontiguousarray(a, dtype=np.int64), device=device)

            self.arange_k = torch.arange(self.kmax, dtype=torch.int64, device=device)
        else:
            import cupy

            if max(self.nnz, *self.shape) >= 2**31:  # cupyx's CSR holds int32 indices
                raise ValueError(
                    f"a sparse matrix of shape {self.shape} with {self.nnz} stored entries "
                    "does not fit CuPy's sparse CSR matrices, whose indices are int32 "
                    "(fewer than 2**31 entries and rows/columns allowed)"
                )

            def up(a: np.ndarray) -> Any:
                with device:
                    return cupy.asarray(np.ascontiguousarray(a, dtype=np.int32))

            with device:
                self.arange_k = cupy.arange(self.kmax, dtype=np.int32)
        self.indptr, self.indices = up(host.indptr), up(host.indices)
        self.indptrT, self.indicesT = up(hostT.indptr), up(hostT.indices)
        self.row_nnz = up(row_nnz)
        self.row_start = up(host.indptr[:-1])
        # rows of nearly equal length (most LIBSVM sets): the padded (n, k_max) block is
        # stored, and a batch is two row gathers from it
        self.ell = self.shape[0] * self.kmax <= 2 * self.nnz
        self.ell_cols = up(host.indices[_padded_positions(host)[0]]) if self.ell else None


def device_indices(indices: Any, x: Any) -> Any:
    """``indices`` on x's device when both are torch tensors or both CuPy arrays, else None.

    Only the shape and dtype are checked: reading the values to check their
    range would cost a device synchronisation per batch. Out-of-range
    torch indices raise ``IndexError`` from torch's indexing on the CPU
    (a device-side assertion on CUDA); CuPy wraps them around.
    """
    lib = device_library(x)
    if lib is None or device_library(indices) != lib:
        return None
    if lib == "torch":
        import torch

        integer = not (
            indices.dtype.is_floating_point
            or indices.dtype.is_complex
            or indices.dtype == torch.bool
        )
    else:
        integer = indices.dtype.kind in "iu"
    if indices.ndim != 1 or not integer:
        raise ValueError(
            f"indices must be a 1-D integer array, got shape {tuple(indices.shape)} and "
            f"dtype {indices.dtype}"
        )
    if indices.shape[0] == 0:
        raise ValueError("indices must not be empty")
    if lib == "torch":
        import torch

        if indices.device == x.device and indices.dtype == torch.int64:
            return indices  # the sampler's: nothing to convert, no operation per batch
        return indices.to(device=x.device, dtype=torch.int64)
    if indices.device != x.device:
        with x.device:
            import cupy

            return cupy.asarray(indices)
    return indices


def _padded_positions(host: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """Positions in ``data`` of the ``(n, k_max)`` padded block, and which slots are real.

    A padding slot points at its row's first entry (an empty row's start is
    clamped into the array), so that it multiplies a zero by an entry of ``x``
    that the row uses anyway.
    """
    start = host.indptr[:-1, None].astype(np.int64)
    k = np.arange(max(int(np.diff(host.indptr).max()), 1))
    valid = k[None, :] < np.diff(host.indptr)[:, None]
    pos = np.minimum(np.where(valid, start + k[None, :], start), host.nnz - 1)
    return pos, valid


class DeviceCSR:
    """:math:`X` (CSR) in one dtype on one device, with the products the problems need.

    ``cdtype`` is the dtype of the stored values: the evaluation dtype
    ``dtype``, or float32 for half-precision evaluations (the sparse kernels
    have no half-precision versions); products take and return ``dtype``.
    """

    def __init__(self, st: _Structure, host: sp.csr_matrix, hostT: sp.csr_matrix, dtype: Any):
        self.st, self.lib = st, st.lib
        n, d = st.shape
        if st.lib == "torch":
            import torch

            self.dtype = dtype
            self.cdtype = dtype if dtype in (torch.float32, torch.float64) else torch.float32
            np_dt = np.float64 if self.cdtype == torch.float64 else np.float32
            self.data = torch.as_tensor(host.data.astype(np_dt), device=st.device)
            self.ell_vals = (
                torch.as_tensor(_padded_values(host, np_dt), device=st.device) if st.ell else None
            )
            dataT = torch.as_tensor(hostT.data.astype(np_dt), device=st.device)
            with warnings.catch_warnings():
                # torch says once per process that sparse CSR support is in beta
                warnings.simplefilter("ignore", UserWarning)
                self.X = torch.sparse_csr_tensor(
                    st.indptr, st.indices, self.data, size=(n, d), check_invariants=False
                )
                self.XT = torch.sparse_csr_tensor(
                    st.indptrT, st.indicesT, dataT, size=(d, n), check_invariants=False
                )
        else:
            import cupy
            import cupyx.scipy.sparse as csp

            self.dtype = np.dtype(dtype)
            half = self.dtype.itemsize < 4
            self.cdtype = np.dtype(np.float32) if half else self.dtype
            with st.device:
                self.data = cupy.asarray(host.data.astype(self.cdtype))
                self.ell_vals = cupy.asarray(_padded_values(host, self.cdtype)) if st.ell else None
                dataT = cupy.asarray(hostT.data.astype(self.cdtype))
                self.X = csp.csr_matrix((self.data, st.indices, st.indptr), shape=(n, d))
                self.XT = csp.csr_matrix((dataT, st.indicesT, st.indptrT), shape=(d, n))

    # ---- dtype handling
    def _in(self, a: Any) -> Any:
        if a.dtype == self.cdtype:
            return a
        return a.to(self.cdtype) if self.lib == "torch" else a.astype(self.cdtype)

    def _out(self, a: Any) -> Any:
        if a.dtype == self.dtype:
            return a
        return a.to(self.dtype) if self.lib == "torch" else a.astype(self.dtype)

    # ---- full products
    def matvec(self, w: Any) -> Any:
        """:math:`Xw` for ``w`` of shape (d,) or (d, K)."""
        return self._out(self.X @ self._in(w))

    def rmatvec(self, r: Any) -> Any:
        """:math:`X^\\top r` for ``r`` of shape (n,) or (n, K)."""
        return self._out(self.XT @ self._in(r))

    # ---- mini-batches
    def rows(self, idx: Any) -> Any:
        """The rows ``idx`` (a 1-D integer array on this device; repeats count)."""
        m = int(idx.shape[0])
        if m * self.st.kmax > self.st.nnz:
            return _SelectedRows(self, idx)
        return _GatheredRows(self, idx)


def _padded_values(host: sp.csr_matrix, dtype: Any) -> np.ndarray:
    pos, valid = _padded_positions(host)
    return np.where(valid, host.data[pos], 0.0).astype(dtype)


def _take(lib: str, a: Any, idx: Any) -> Any:
    """``a[idx]`` for a 1-D ``a`` and an index array of any shape (torch: bounds-checked)."""
    if lib == "torch":
        import torch

        # index_select on the flattened indices: several times faster than torch.take on CPUs
        return torch.index_select(a, 0, idx.reshape(-1)).reshape(idx.shape)
    return a[idx]


def _take_rows(lib: str, a: Any, idx: Any) -> Any:
    """Rows ``idx`` (1-D) of ``a``, along axis 0."""
    if lib == "torch":
        import torch

        return torch.index_select(a, 0, idx)
    return a[idx]


def _scatter_add(lib: str, out: Any, idx: Any, vals: Any) -> Any:
    """``out[idx[j]] += vals[j]`` along axis 0, repeats accumulated; returns ``out``."""
    if lib == "torch":
        return out.index_add_(0, idx, vals)
    import cupy

    if hasattr(cupy.add, "at"):  # CuPy >= 12; its cupyx.scatter_add warns from CuPy 14 on
        cupy.add.at(out, idx, vals)
    else:
        import cupyx

        cupyx.scatter_add(out, idx, vals)
    return out


def _zeros(lib: str, shape: tuple[int, ...], like: Any) -> Any:
    if lib == "torch":
        import torch

        return torch.zeros(shape, dtype=like.dtype, device=like.device)
    import cupy

    return cupy.zeros(shape, dtype=like.dtype)


class _GatheredRows:
    """The selected rows as an ``(m, k_max)`` block of column indices and values."""

    def __init__(self, M: DeviceCSR, idx: Any):
        st, lib = M.st, M.lib
        self.M = M
        if M.ell_vals is not None:
            self.cols = _take_rows(lib, st.ell_cols, idx)
            self.vals = _take_rows(lib, M.ell_vals, idx)
            self.flat_cols = self.cols.reshape(-1)
            return
        start = _take(lib, st.row_start, idx)
        count = _take(lib, st.row_nnz, idx)
        pos = start[:, None] + st.arange_k[None, :]
        valid = st.arange_k[None, :] < count[:, None]
        # padding slots point at the row's own first entry (an empty row's start is clamped
        # into the array), so a padded slot multiplies a zero by an entry x that the row uses
        pos = _where(lib, valid, pos, start[:, None])
        pos = _minimum(lib, pos, st.nnz - 1)
        self.cols = _take(lib, st.indices, pos)
        vals = _take(lib, M.data, pos)
        self.vals = vals * valid
        self.flat_cols = self.cols.reshape(-1)

    def matvec(self, w: Any) -> Any:
        M, lib = self.M, self.M.lib
        w = M._in(w)
        if w.ndim == 1:
            out = (self.vals * _take(lib, w, self.cols)).sum(1)
        else:
            m, k = self.cols.shape
            Wg = _take_rows(lib, w, self.flat_cols).reshape(m, k, w.shape[1])
            out = (self.vals[:, :, None] * Wg).sum(1)
        return M._out(out)

    def rmatvec(self, r: Any) -> Any:
        M, lib = self.M, self.M.lib
        r = M._in(r)
        d = M.st.shape[1]
        if r.ndim == 1:
            contrib = (self.vals * r[:, None]).reshape(-1)
            out = _zeros(lib, (d,), contrib)
        else:
            K = r.shape[1]
            contrib = (self.vals[:, :, None] * r[:, None, :]).reshape(-1, K)
            out = _zeros(lib, (d, K), contrib)
        return M._out(_scatter_add(lib, out, self.flat_cols, contrib))


class _SelectedRows:
    """The selected rows through the full products: :math:`(Xw)_S`, :math:`X^\\top P_S^\\top r`."""

    def __init__(self, M: DeviceCSR, idx: Any):
        self.M, self.idx = M, idx

    def matvec(self, w: Any) -> Any:
        return _take_rows(self.M.lib, self.M.matvec(w), self.idx)

    def rmatvec(self, r: Any) -> Any:
        M = self.M
        n = M.st.shape[0]
        full = _zeros(M.lib, (n, *r.shape[1:]), r)
        return M.rmatvec(_scatter_add(M.lib, full, self.idx, r))


def _where(lib: str, cond: Any, a: Any, b: Any) -> Any:
    if lib == "torch":
        import torch

        return torch.where(cond, a, b)
    import cupy

    return cupy.where(cond, a, b)


def _minimum(lib: str, a: Any, hi: int) -> Any:
    if lib == "torch":
        return a.clamp(max=hi)
    import cupy

    return cupy.minimum(a, hi)
