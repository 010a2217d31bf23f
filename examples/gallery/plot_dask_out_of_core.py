r"""
Out of core with dask: logistic regression from chunks on disk
==============================================================

:func:`amopt.minimize` takes dask arrays: give a problem of :mod:`amopt.problems` a
design matrix chunked by rows and a dask starting point, and every step reads the chunks,
one task per chunk, without gathering the matrix into memory. Here the matrix is written to
disk as a stack of ``.npy`` chunks and read back lazily with :func:`dask.array.from_npy_stack`,
so a step holds a few chunks in memory at a time (one per thread), however many there
are. We minimise an L2-regularised logistic regression with AM-MGD on it, and again on the
same data in memory with NumPy: the two runs compute the same iterates.
"""

import tempfile
import time

import dask
import dask.array as da
import matplotlib.pyplot as plt
import numpy as np

import amopt
from amopt.problems import LogisticRegression

# %%
# The data: 100,000 samples of 20 features in 5 chunks of 20,000 rows, labels from a
# noisy linear model. Written chunk by chunk (``to_npy_stack``) and read back lazily.
n, d, rows_per_chunk = 100_000, 20, 20_000
rng = da.random.default_rng(0)
X_gen = rng.standard_normal((n, d), chunks=(rows_per_chunk, d))
w_true = np.linspace(-1, 1, d)
y_gen = (X_gen @ w_true + 0.5 * rng.standard_normal(n, chunks=rows_per_chunk) > 0).astype(float)

folder = tempfile.TemporaryDirectory()
da.to_npy_stack(f"{folder.name}/X", X_gen)
da.to_npy_stack(f"{folder.name}/y", y_gen)
X = da.from_npy_stack(f"{folder.name}/X")
y = da.from_npy_stack(f"{folder.name}/y")
mib = 2**20
print(f"X: {X.shape}, {X.numblocks[0]} chunks of {X.chunks[0][0]} rows, {X.nbytes / mib:.1f} MiB")
print(f"one chunk: {X.blocks[0].nbytes / mib:.1f} MiB")

# %%
# The same problem twice: on the dask arrays (each step one graph over the chunks) and on
# NumPy copies of them (a check only: a matrix that does not fit in memory has no such
# copy). ``L`` of the dask problem is accumulated over the chunks.
lazy = LogisticRegression(X, y, l2=1e-3)
in_memory = LogisticRegression(X.compute(), y.compute(), l2=1e-3)
print(f"L: dask {lazy.L:.6f}, NumPy {in_memory.L:.6f}")

options = {"lr": 1 / in_memory.L, "maxiter": 30, "gtol": 0}


def recorder(out):
    """A callback that appends f(x_t) to ``out`` (given an ``OptimizeResult``)."""

    def record(intermediate_result):
        out.append(float(intermediate_result.fun))

    return record


f_dask, f_numpy = [], []
with dask.config.set(scheduler="threads", num_workers=2):
    t0 = time.perf_counter()
    res_dask = amopt.minimize(
        lazy, da.zeros(d, chunks=d), method="am-mgd", options=options, callback=recorder(f_dask)
    )
    x_dask = np.asarray(res_dask.x.compute())
    t_dask = time.perf_counter() - t0
t0 = time.perf_counter()
res_numpy = amopt.minimize(
    in_memory, np.zeros(d), method="am-mgd", options=options, callback=recorder(f_numpy)
)
t_numpy = time.perf_counter() - t0

print(f"dask:  {res_dask.nit} iterations, f = {float(res_dask.fun):.10f}, {t_dask:.1f} s")
print(f"NumPy: {res_numpy.nit} iterations, f = {float(res_numpy.fun):.10f}, {t_numpy:.2f} s")
diff = np.max(np.abs(x_dask - res_numpy.x))
print(f"max |x_dask - x_numpy| = {diff:.1e} (max |x| = {np.max(np.abs(res_numpy.x)):.2f})")
beta_diff = np.max(np.abs(np.asarray(res_dask.betas) - np.asarray(res_numpy.betas)))
print(f"max |beta_t(dask) - beta_t(NumPy)| = {beta_diff:.1e}")

# %%
# The two runs' loss along the way (recorded with a ``callback``), and how far apart the
# runs are at each iteration: the relative difference of their losses and the difference of
# their :math:`\beta_t` (``res.betas``). The sums over chunks are added in another order than
# NumPy's one matrix product, so the runs differ by rounding only: the losses by about the
# float64 epsilon, :math:`\beta_t` (formed from those sums) by more, far below anything that
# changes the run (exact zeros are drawn at the bottom of the axis).
f_dask, f_numpy = np.array(f_dask), np.array(f_numpy)
rel_f = np.abs(f_dask - f_numpy) / np.abs(f_numpy)
d_beta = np.abs(np.asarray(res_dask.betas) - np.asarray(res_numpy.betas))
floor = 1e-18

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
ax1.plot(f_numpy, lw=3, alpha=0.5, label="NumPy, in memory")
ax1.plot(f_dask, "k--", lw=1, label="dask, chunks from disk")
ax1.set(xlabel="iteration t", ylabel=r"$f(x_t)$", title="AM-MGD on the logistic loss")
ax1.legend()
ax2.semilogy(np.maximum(rel_f, floor), "o-", ms=3, label=r"$|f_{dask} - f_{NumPy}| / f_{NumPy}$")
ax2.semilogy(np.maximum(d_beta, floor), "s-", ms=3, label=r"$|\beta_t^{dask} - \beta_t^{NumPy}|$")
ax2.axhline(np.finfo(float).eps, color="k", lw=0.6, ls=":", label="float64 epsilon")
ax2.set(xlabel="iteration t", ylim=(floor / 2, 1e-10), title="dask against NumPy")
ax2.legend(fontsize=8)
fig.tight_layout()
plt.show()

folder.cleanup()
