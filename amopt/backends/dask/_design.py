"""Chunked design matrices: the finite-sum problems of :mod:`amopt.problems` on dask arrays.

:class:`DaskDesign` stands in for the in-memory design of
:mod:`amopt.problems._base` when ``X`` is a dask array. ``X`` stays chunked
by rows (dense NumPy chunks or SciPy sparse chunks) and is never gathered
into one array: the products ``X w`` and ``X^T r`` are one task per row
chunk (plus a tree sum for ``X^T r``), mini-batches take only the rows they
index, and the spectral constants are chunked reductions.

The objective and gradient of a problem on a dask design are lazy for dask
``x`` (for :func:`amopt.minimize` and any dask workflow) and computed, with
one graph submission, for NumPy ``x`` (for the reference solvers and for
checks against the in-memory problem).
"""

from __future__ import annotations

import hashlib
from typing import Any

import array_api_compat
import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

__all__ = ["DaskDesign", "GRAM_MAX_FEATURES", "label_targets"]

#: Up to this many features, ``lambda_max(X^T X)`` comes from the Gram matrix,
#: accumulated in one pass over the chunks; above it, from Lanczos iterations on
#: the chunked operator (one pass per product).
GRAM_MAX_FEATURES = 2048


# --------------------------------------------------------------------------- chunk functions
# Each runs on one row chunk ``b`` (a NumPy array or a SciPy sparse matrix).


def _inspect_block(b: Any) -> np.ndarray:
    """``[[non-finite count, row, column, value of the first one, any nonzero]]``."""
    if sp.issparse(b):
        b = sp.csr_matrix(b)
        bad = ~np.isfinite(b.data)
        nonzero = bool(np.any(b.data))
    else:
        bad = ~np.isfinite(b)
        nonzero = bool(np.any(b))
    count = int(np.count_nonzero(bad))
    row = col = value = -1.0
    if count:
        k = int(np.argmax(bad.ravel()))
        if sp.issparse(b):
            row, col = int(np.searchsorted(b.indptr, k, side="right")) - 1, int(b.indices[k])
            value = b.data[k]
        else:
            row, col = divmod(k, b.shape[1])
            value = b.ravel()[k]
    return np.array([[count, row, col, value, nonzero]], dtype=np.float64)


def _inspect_targets_block(t: np.ndarray) -> np.ndarray:
    """``[[non-finite count, row of the first one, its value]]``."""
    flat = t.reshape(t.shape[0], -1)
    bad = ~np.isfinite(flat)
    count = int(np.count_nonzero(bad))
    if not count:
        return np.array([[0.0, -1.0, -1.0]])
    i, j = divmod(int(np.argmax(bad.ravel())), flat.shape[1])
    return np.array([[count, i, flat[i, j]]])


def _row_sq_block(b: Any) -> np.ndarray:
    if sp.issparse(b):
        return np.asarray(b.multiply(b).sum(axis=1), dtype=np.float64).ravel()
    return np.einsum("ij,ij->i", b, b)


def _matvec_block(bs: list, ws: list) -> np.ndarray:
    # lists of the column blocks of one row chunk and the matching pieces of w (one
    # each here): taking them as lists spares the copy that concatenating them makes
    out = np.asarray(bs[0] @ ws[0])
    for b, w in zip(bs[1:], ws[1:], strict=True):
        out = out + np.asarray(b @ w)
    return out


def _rmatvec_block(b: Any, r: np.ndarray) -> np.ndarray:
    return np.asarray(b.T @ r)[None]


def _gram_block(b: Any, weights: np.ndarray | None = None) -> np.ndarray:
    if weights is None:
        g = b.T @ b
    elif sp.issparse(b):
        g = b.T @ b.multiply(weights[:, None]).tocsr()
    else:
        g = b.T @ (b * weights[:, None])
    return np.asarray(g.toarray() if sp.issparse(g) else g, dtype=np.float64)[None]


def _digest_block(b: Any) -> np.ndarray:
    h = hashlib.sha256()
    if sp.issparse(b):
        b = sp.csr_matrix(b)
        for a in (b.indptr, b.indices, b.data):
            h.update(np.ascontiguousarray(a).tobytes())
    else:
        h.update(np.ascontiguousarray(b).tobytes())
    return np.array([h.hexdigest()], dtype=object)


# --------------------------------------------------------------------------- helpers


def _is_dask(a: Any) -> bool:
    return array_api_compat.is_dask_array(a)


def _sparse_chunks(X: Any) -> bool:
    return sp.issparse(getattr(X, "_meta", None))


def _one_chunk(a: Any) -> Any:
    return a if all(len(c) == 1 for c in a.chunks) else a.rechunk(-1)


def label_targets(y: Any, kind: str, classes: np.ndarray) -> Any:
    """The logistic targets of dask labels ``y``, lazily, chunked like ``y``.

    ``kind="binary"``: ``+1`` where ``y`` equals the largest class, else ``-1``
    (as :func:`amopt.datasets.binary_labels`); ``"softmax"``: one-hot rows
    over ``classes``.
    """
    if kind == "binary":
        return da.where(y == classes[-1], 1.0, -1.0)
    return (y[:, None] == da.from_array(classes)[None, :]).astype(np.float64)


class DaskDesign:
    """A row-chunked dask design matrix ``X`` and its targets.

    Parameters
    ----------
    X : dask.array.Array, shape (n_samples, n_features)
        Real floating or integer entries, in dense (NumPy) or SciPy sparse
        chunks. Column chunks are merged (each row chunk is used whole).
    targets : numpy.ndarray or dask.array.Array, shape (n_samples,) or (n_samples, K)
        Regression targets or encoded labels; a NumPy array is wrapped in a
        dask array chunked like the rows of ``X``.

    Raises
    ------
    TypeError, ValueError
        As the in-memory design: wrong dtype, shape, or a NaN or infinity in
        ``X`` or ``targets`` (checked in one pass over the chunks).
    """

    lazy = True
    XT = None

    def __init__(self, X: Any, targets: Any):
        if len(X.shape) != 2:
            raise ValueError(f"X must be 2-D (n_samples, n_features), got shape {X.shape}")
        if any(np.isnan(s) for s in X.shape):
            raise ValueError(
                f"X must have known chunk sizes, got shape {X.shape}; call "
                "X.compute_chunk_sizes() first"
            )
        n, d = (int(s) for s in X.shape)
        if n < 1 or d < 1:
            raise ValueError(f"X must have at least one row and one column, got shape {X.shape}")
        kind = np.dtype(X.dtype).kind
        if kind not in "fiub":
            raise TypeError(f"X must hold real numbers, got dtype {X.dtype}")
        if kind != "f":
            X = X.astype(np.float64)
        if len(X.chunks[1]) != 1:
            X = X.rechunk({1: -1})
        if int(targets.shape[0]) != n:
            raise ValueError(
                f"X has {n} rows but y has {targets.shape[0]} entries; they must match"
            )
        row_chunks = X.chunks[0]
        if not _is_dask(targets):
            targets = da.from_array(
                np.asarray(targets), chunks=(row_chunks,) + tuple((s,) for s in targets.shape[1:])
            )
        elif targets.chunks[0] != row_chunks:
            targets = targets.rechunk({0: row_chunks})
        self.sparse = _sparse_chunks(X)
        self._check_values(X, targets)
        self.X = X
        self.targets = targets
        self.n, self.d = n, d
        self._cache: dict[str, tuple[Any, Any]] = {}
        self._row_sq: np.ndarray | None = None
        self._gram_max: float | None = None

    @staticmethod
    def _check_values(X: Any, targets: Any) -> None:
        """Finite ``X`` and targets, ``X`` not all zero: one pass, errors as in memory."""
        nb = len(X.chunks[0])
        per_x = X.map_blocks(_inspect_block, chunks=((1,) * nb, (5,)), dtype=np.float64)
        t = targets if targets.ndim == 1 else targets.reshape((targets.shape[0], -1))
        per_t = t.map_blocks(_inspect_targets_block, chunks=((1,) * nb, (3,)),
                             new_axis=1 if t.ndim == 1 else None, dtype=np.float64)  # fmt: skip
        per_x, per_t = dask.compute(per_x, per_t)
        starts = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]])
        bad = np.flatnonzero(per_x[:, 0])
        if bad.size:
            c = bad[0]
            count, row, col, value = per_x[c, :4]
            raise ValueError(
                f"X contains NaN or infinite values, but must be finite: "
                f"X[{int(starts[c] + row)}, {int(col)}] = {float(value)!r} "
                f"({int(per_x[:, 0].sum())} non-finite in all)"
            )
        if not per_x[:, 4].any():
            raise ValueError(
                f"X must have at least one nonzero entry, got an all-zero X of shape {X.shape} "
                "(the objective would not depend on the data)"
            )
        bad = np.flatnonzero(per_t[:, 0])
        if bad.size:
            c = bad[0]
            raise ValueError(
                f"y contains NaN or infinite values, but must be finite: "
                f"y[{int(starts[c] + per_t[c, 1])}] = {float(per_t[c, 2])!r} "
                f"({int(per_t[:, 0].sum())} non-finite in all)"
            )

    # ---- evaluation
    def arrays(self, dtype: Any) -> tuple[Any, Any]:
        """``(X, targets)`` in ``dtype`` (lazily cast; the chunks keep their type)."""
        key = str(np.dtype(dtype))
        hit = self._cache.get(key)
        if hit is None:
            X = self.X if self.X.dtype == dtype else self.X.astype(dtype)
            t = self.targets if self.targets.dtype == dtype else self.targets.astype(dtype)
            hit = self._cache[key] = (X, t)
        return hit

    def matvec(self, X: Any, w: Any) -> Any:
        """``X @ w`` for ``w`` of shape (d,) or (d, K): one task per row chunk."""
        w = _one_chunk(w)
        dtype = np.result_type(X.dtype, w.dtype)
        if w.ndim == 1:
            return da.blockwise(_matvec_block, "i", X, "ij", w, "j", dtype=dtype)
        return da.blockwise(_matvec_block, "ik", X, "ij", w, "jk", dtype=dtype)

    def rmatvec(self, X: Any, r: Any, xp: Any = None, XT: Any = None) -> Any:
        """``X^T r`` for ``r`` of shape (n,) or (n, K): per-chunk products, then a tree sum."""
        if len(r.chunks[-1]) != 1 and r.ndim == 2:
            r = r.rechunk({1: -1})
        dtype = np.result_type(X.dtype, r.dtype)
        if r.ndim == 1:
            parts = da.blockwise(_rmatvec_block, "ij", X, "ij", r, "i", dtype=dtype,
                                 adjust_chunks={"i": 1})  # fmt: skip
        else:
            parts = da.blockwise(_rmatvec_block, "ijk", X, "ij", r, "ik", dtype=dtype,
                                 adjust_chunks={"i": 1})  # fmt: skip
        return parts.sum(axis=0)

    def rows(self, X: Any, targets: Any, idx: np.ndarray) -> tuple[Any, Any]:
        """The rows ``idx`` (repeats and order kept): only the chunks they fall in are read."""
        return X[idx], targets[idx]

    def evaluate(self, fn: Any, x: Any, m: int, idx: np.ndarray | None = None) -> tuple:
        """``fn(x, xp, X, targets, m)`` on the chunks, lazily for dask ``x``.

        For a NumPy ``x`` the value and gradient are computed (one graph
        submission) and returned as a NumPy float64 and array.
        """
        eager = not _is_dask(x)
        if eager:
            if not isinstance(x, np.ndarray):
                raise TypeError(
                    "a problem built on a dask array evaluates dask or NumPy arrays, got "
                    f"{type(x).__module__}.{type(x).__name__}"
                )
            x = da.from_array(x, chunks=-1)
        X, t = self.arrays(x.dtype)
        if idx is not None:
            X, t = self.rows(X, t, idx)
        f, g = fn(x, array_api_compat.array_namespace(x), X, t, m)
        if not eager:
            return f, g
        f, g = dask.compute(f, g)
        return np.float64(f), np.asarray(g)

    # ---- spectral quantities and other reductions (computed, float64)
    @property
    def row_sq_norms(self) -> np.ndarray:
        """``||a_i||^2`` for every row (one pass)."""
        if self._row_sq is None:
            sq = self.X.map_blocks(_row_sq_block, drop_axis=1, dtype=np.float64)
            self._row_sq = np.asarray(sq.compute(), dtype=np.float64)
        return self._row_sq

    def weighted_gram(self, weights: Any = None) -> np.ndarray:
        r""":math:`X^\top \mathrm{diag}(w) X` (``weights=None``: :math:`X^\top X`), one pass.

        ``weights`` is a lazy or NumPy vector over the rows.
        """
        X = self.X
        if weights is None:
            parts = da.blockwise(_gram_block, "ijk", X, "ij", new_axes={"k": self.d},
                                 adjust_chunks={"i": 1}, dtype=np.float64)  # fmt: skip
        else:
            if not _is_dask(weights):
                weights = da.from_array(np.asarray(weights, dtype=np.float64),
                                        chunks=(X.chunks[0],))  # fmt: skip
            parts = da.blockwise(_gram_block, "ijk", X, "ij", weights, "i",
                                 new_axes={"k": self.d}, adjust_chunks={"i": 1},
                                 dtype=np.float64)  # fmt: skip
        return np.asarray(parts.sum(axis=0).compute())

    @property
    def gram_max(self) -> float:
        r"""Largest eigenvalue of :math:`X^\top X`, without gathering ``X``.

        Up to :data:`GRAM_MAX_FEATURES` features: the Gram matrix, accumulated
        chunk by chunk in one pass, and its exact eigenvalues. Above: Lanczos
        (``scipy.sparse.linalg.eigsh``, the power iteration's Krylov
        refinement) on the operator :math:`v \mapsto X^\top (X v)`, each product
        one pass over the chunks.
        """
        if self._gram_max is None:
            d = self.d
            if d <= GRAM_MAX_FEATURES:
                G = self.weighted_gram()
                self._gram_max = float(np.linalg.eigvalsh(0.5 * (G + G.T))[-1])
            else:
                X = self.X.astype(np.float64) if self.X.dtype != np.float64 else self.X

                def normal(v: np.ndarray) -> np.ndarray:
                    w = da.from_array(np.asarray(v, dtype=np.float64).ravel(), chunks=-1)
                    return np.asarray(self.rmatvec(X, self.matvec(X, w)).compute())

                op = spla.LinearOperator((d, d), matvec=normal, dtype=np.float64)
                vals = spla.eigsh(op, k=1, which="LA", v0=np.ones(d) / np.sqrt(d), tol=1e-12,
                                  ncv=min(d, 32), maxiter=100 * d,
                                  return_eigenvectors=False)  # fmt: skip
                self._gram_max = float(vals[0])
        return self._gram_max

    def lstsq(self, l2: float) -> np.ndarray:
        r"""The minimum-norm minimiser of the least-squares objective with ridge ``l2``.

        That is, of :math:`\frac{1}{2n}\|Xx - y\|^2 + \frac{\ell_2}{2}\|x\|^2`.

        Dense chunks: tall-and-skinny QR of ``[X; sqrt(n l2) I]`` (one pass),
        then the small least-squares problem :math:`R x = Q^\top y` by SVD.
        Sparse chunks: LSQR on the chunked operator.
        """
        n, d = self.n, self.d
        damp = float(np.sqrt(n * l2))
        X, y = self.arrays(np.float64)
        if self.sparse:

            def mv(v: np.ndarray) -> np.ndarray:
                return np.asarray(self.matvec(X, da.from_array(v.ravel(), chunks=-1)).compute())

            def rmv(v: np.ndarray) -> np.ndarray:
                r = da.from_array(v.ravel(), chunks=(X.chunks[0],))
                return np.asarray(self.rmatvec(X, r).compute())

            op = spla.LinearOperator((n, d), matvec=mv, rmatvec=rmv, dtype=np.float64)
            return spla.lsqr(op, np.asarray(y.compute()), damp=damp, atol=1e-14, btol=1e-14,
                             conlim=1e16, iter_lim=20 * (d + n))[0]  # fmt: skip
        if damp:
            X = da.concatenate([X, da.from_array(damp * np.eye(d), chunks=(d, d))], axis=0)
            y = da.concatenate([y, da.zeros(d, chunks=d)])
        Q, R = da.linalg.qr(X)
        R, c = dask.compute(R, Q.T @ y)
        return np.linalg.lstsq(R, c, rcond=None)[0]

    def digest(self, *extra: Any) -> str:
        """SHA-256 of the chunks, the targets and ``extra`` (a reference-solution cache key)."""
        nb = len(self.X.chunks[0])
        per_chunk = self.X.map_blocks(_digest_block, chunks=((1,) * nb,), drop_axis=1,
                                      dtype=object)  # fmt: skip
        chunk_digests, targets = dask.compute(per_chunk, self.targets)
        h = hashlib.sha256()
        h.update(repr(("dask", self.X.shape, self.X.chunks, self.sparse, extra)).encode())
        for hexdigest in chunk_digests:
            h.update(hexdigest.encode())
        h.update(np.ascontiguousarray(targets).tobytes())
        return h.hexdigest()
