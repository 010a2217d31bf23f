"""High-accuracy reference solutions (x*, f*) with an in-memory and an on-disk cache.

Where they are kept: ``<cache home>/reference/<key>.npz``, the cache home being
``cache_dir=`` of ``reference_solution``, else ``$AMOPT_CACHE_DIR``, else the
platform's user cache directory (``$XDG_CACHE_HOME/amopt`` or ``~/.cache/amopt``
on Linux, ``~/Library/Caches/amopt`` on macOS, ``%LOCALAPPDATA%\\amopt\\Cache``
on Windows; :func:`amopt.datasets.get_cache_home`). Never the data folder
(``AMOPT_DATA_DIR``), which may be shared and read-only. The files may be
deleted at any time; a cache that cannot be written is skipped.

A solve that runs past :data:`NOTICE_AFTER_S` seconds says so once, on the
``amopt.cache`` logger (level INFO, printed to stderr by default, like the
download notices of ``scipy.datasets``): what is computed and where it will be
cached. ``logging.getLogger("amopt.cache").setLevel(logging.WARNING)`` silences it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.optimize

__all__ = ["NOTICE_AFTER_S", "ReferenceSolution", "ReferenceSolutionWarning", "logger"]

_MEMORY: dict[str, ReferenceSolution] = {}
_FORMAT = 1
#: A reference solve still running after this many seconds logs one notice.
NOTICE_AFTER_S = 2.0


class _StderrHandler(logging.StreamHandler):
    """Writes to the ``sys.stderr`` of the moment (as :data:`logging.lastResort`), so a
    redirected or captured stderr receives the notice."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


#: The logger of the cache notices: INFO, to stderr, not propagated (one line, not two,
#: where the root logger is configured too). Replace its handlers to route the notices.
logger = logging.getLogger("amopt.cache")
if not logger.handlers:
    _handler = _StderrHandler()
    _handler.setFormatter(logging.Formatter("amopt: %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


#: What the key prefix of a problem names, for the notice.
_KINDS = {"logreg": "logistic regression", "huber": "Huber regression"}


class _Notice:
    """Logs one line once a solve has run for :data:`NOTICE_AFTER_S` seconds."""

    def __init__(self, what: str, path: Path | None) -> None:
        self.what, self.path = what, path
        self.start = time.perf_counter()
        self.done = False

    def __call__(self, *_: object) -> None:
        if self.done or time.perf_counter() - self.start < NOTICE_AFTER_S:
            return
        self.done = True
        where = (
            f"it will be cached in {self.path}" if self.path is not None
            else "it is not cached on disk (cache=False)"
        )  # fmt: skip
        logger.info(
            "computing %s (L-BFGS-B; running for %.0f s so far); %s", self.what,
            time.perf_counter() - self.start, where,
        )  # fmt: skip


class ReferenceSolutionWarning(UserWarning):
    """The reference solve stopped before reaching its gradient tolerance.

    Examples
    --------
    On separable data without an L2 term the logistic loss has no minimiser,
    so an unreachable ``gtol`` is reported with this warning:

    >>> import warnings
    >>> import numpy as np
    >>> from amopt.problems import LogisticRegression, ReferenceSolutionWarning
    >>> X = np.array([[1.0], [2.0], [-1.0], [-2.0]])
    >>> prob = LogisticRegression(X, np.array([1, 1, 0, 0]))
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always", ReferenceSolutionWarning)
    ...     sol = prob.reference_solution(gtol=1e-100, maxiter=5, cache=False)
    >>> [w.category.__name__ for w in caught], sol.converged
    (['ReferenceSolutionWarning'], False)
    """


@dataclasses.dataclass(frozen=True)
class ReferenceSolution:
    """A reference minimiser.

    Attributes
    ----------
    x : numpy.ndarray
        The minimiser (float64, flattened).
    fun : float
        ``f(x)``.
    grad_norm : float
        Largest absolute gradient entry at ``x``.
    gtol : float
        The tolerance the solve was asked for.
    converged : bool
        ``grad_norm <= gtol``.
    nit : int
        L-BFGS-B iterations (0 when loaded from a cache or known analytically).

    Examples
    --------
    >>> import numpy as np
    >>> from amopt.problems import LeastSquares
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> sol = LeastSquares(X, np.array([1.0, 2.0, 3.0])).reference_solution()
    >>> np.round(sol.x, 12).tolist(), round(sol.fun, 12), sol.converged, sol.nit
    ([1.0, 2.0], 0.0, True, 0)
    """

    x: np.ndarray
    fun: float
    grad_norm: float
    gtol: float
    converged: bool
    nit: int = 0


def _satisfies(sol: ReferenceSolution, gtol: float) -> bool:
    """A stored solution answers a request for ``gtol`` if it reached it."""
    return sol.grad_norm <= gtol


def _for_request(sol: ReferenceSolution, gtol: float) -> ReferenceSolution:
    """A stored solution as the answer to a request for ``gtol`` (no solver iterations)."""
    return dataclasses.replace(sol, gtol=gtol, converged=sol.grad_norm <= gtol, nit=0)


def _cache_file(key: str, cache_dir) -> Path:
    """``<cache home>/reference/<key>.npz`` (:func:`amopt.datasets.get_cache_home`)."""
    from ..datasets import get_cache_home

    return get_cache_home(cache_dir) / "reference" / f"{key}.npz"


def solve_reference(
    key: str,
    value_and_grad: Callable[[np.ndarray], tuple[float, np.ndarray]],
    x0: np.ndarray,
    *,
    gtol: float,
    maxiter: int,
    cache: bool,
    cache_dir: str | os.PathLike[str] | None,
    hess: Callable[[np.ndarray], np.ndarray] | None = None,
) -> ReferenceSolution:
    """Minimise a smooth function with L-BFGS-B to ``gtol`` (sup-norm of the gradient).

    L-BFGS-B stalls once the decrease of ``f`` drops below its rounding error,
    which on ill-conditioned problems (e.g. a9a without an L2 term) happens
    before ``gtol = 1e-10``. If ``hess`` (the dense Hessian) is given, Newton
    steps then finish the job (aiming at ``gtol / 1000``), accepted on a
    decrease of ``max|grad|``, which stays measurable where ``f`` no longer does.

    Results are memoised under ``key`` (a hash of the data and parameters) in
    memory and, if ``cache``, in ``<cache home>/reference/<key>.npz`` (see the
    module docstring; never in the data folder). A solve that runs longer than
    :data:`NOTICE_AFTER_S` seconds logs one notice on ``amopt.cache``. A cached
    solution is reused only if its gradient, re-evaluated at the stored ``x``,
    meets ``gtol``; ``f*`` is re-evaluated there too. An unreadable, truncated,
    stale or non-finite cache entry is recomputed and overwritten; cache files
    are written atomically.
    """
    full_key = f"{key}-{_FORMAT}"
    hit = _MEMORY.get(full_key)
    if hit is not None and _satisfies(hit, gtol):
        return _for_request(hit, gtol)
    path = _cache_file(full_key, cache_dir) if cache else None

    def fg(z: np.ndarray) -> tuple[float, np.ndarray]:
        f, g = value_and_grad(z)
        return float(f), np.asarray(g, dtype=np.float64).ravel()

    if path is not None:
        sol = _load_cached(path, np.shape(x0), fg)
        if sol is not None and _satisfies(sol, gtol):
            _MEMORY[full_key] = sol
            return _for_request(sol, gtol)

    notice = _Notice(
        f"the reference solution (x*, f*) of a {_KINDS.get(key.split('-')[0], key)} problem "
        f"(dim {math.prod(np.shape(x0))}) to max|grad| <= {gtol:g}", path,
    )  # fmt: skip

    def fg_noticed(z: np.ndarray) -> tuple[float, np.ndarray]:
        notice()
        return fg(z)

    res = scipy.optimize.minimize(
        fg_noticed,
        np.asarray(x0, dtype=np.float64).ravel(),
        jac=True,
        method="L-BFGS-B",
        options={"gtol": gtol, "ftol": 0.0, "maxiter": maxiter, "maxfun": 2 * maxiter,
                 "maxcor": 30},
    )  # fmt: skip
    x = np.asarray(res.x)
    f, g = fg(x)
    gnorm = float(np.max(np.abs(g))) if g.size else 0.0
    nit = int(res.nit)
    if hess is not None:  # go past gtol while Newton keeps improving: f* to ~1e-15
        x, f, gnorm, extra = _newton_polish(fg_noticed, hess, x, f, g, gnorm, 1e-3 * gtol)
        nit += extra
    sol = ReferenceSolution(
        x=x, fun=f, grad_norm=gnorm, gtol=gtol, converged=gnorm <= gtol, nit=nit
    )
    if not sol.converged:
        warnings.warn(
            f"reference solve stopped at max|grad| = {gnorm:.3g} > gtol = {gtol:g} after "
            f"{nit} iterations ({res.message}); f* = {f!r} may be inaccurate "
            "(for separable data without an L2 term the infimum is not attained)",
            ReferenceSolutionWarning,
            stacklevel=3,
        )
    _MEMORY[full_key] = sol
    if path is not None:
        _save_cached(path, sol)
    return sol


def _load_cached(
    path: Path, shape: tuple[int, ...], fg: Callable[[np.ndarray], tuple[float, np.ndarray]]
) -> ReferenceSolution | None:
    """The solution stored at ``path``, re-evaluated with ``fg``; None if absent or unusable.

    Any defect (a truncated or foreign file, missing fields, another format
    version, a wrong shape, non-finite values) makes the entry a miss. ``f``
    and ``max|grad|`` are recomputed at the stored ``x`` rather than read, so a
    stale or damaged entry is judged by what the objective gives there.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            fields = {k: np.asarray(z[k]) for k in ("format", "x", "fun", "grad_norm", "gtol")}
    except FileNotFoundError:
        return None
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile):
        return None  # unreadable, or not written by this module
    x = fields["x"]
    scalars = [fields[k] for k in ("format", "fun", "grad_norm", "gtol")]
    if any(a.shape != () or a.dtype.kind not in "iuf" for a in scalars):
        return None
    fmt, fun, grad_norm, gtol = (float(a) for a in scalars)
    if fmt != _FORMAT or x.dtype != np.float64 or x.shape != (math.prod(shape),):
        return None
    if not (np.all(np.isfinite(x)) and math.isfinite(fun) and grad_norm >= 0 and gtol > 0):
        return None  # NaN compares false: a NaN grad_norm or gtol fails here too
    x = x.copy()
    f, g = fg(x)
    gnorm = float(np.max(np.abs(g))) if g.size else 0.0
    if not (math.isfinite(f) and math.isfinite(gnorm)):
        return None
    return ReferenceSolution(
        x=x, fun=f, grad_norm=gnorm, gtol=gtol, converged=gnorm <= gtol, nit=0
    )


def _save_cached(path: Path, sol: ReferenceSolution) -> None:
    """Write ``sol`` to ``path`` atomically (a temporary file, then :func:`os.replace`)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    except OSError:
        return  # the on-disk cache is an optimisation; a read-only home is not an error
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(
                fh, format=_FORMAT, x=sol.x, fun=sol.fun, grad_norm=sol.grad_norm,
                gtol=sol.gtol, converged=sol.converged,
            )  # fmt: skip
        os.replace(tmp, path)
    except OSError:
        pass  # a full disk: keep whatever entry was there
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _newton_polish(fg, hess, x, f, g, gnorm, gtol, max_steps: int = 50):
    """Newton steps (pseudo-inverse solves: the Hessian may be singular) with a backtracking
    search on ``max|grad|``; returns ``(x, f, max|grad|, steps)``."""
    steps = 0
    for _ in range(max_steps):
        if gnorm <= gtol:
            break
        lam, V = np.linalg.eigh(hess(x))  # PSD, possibly singular: pseudo-inverse step
        keep = lam > lam[-1] * 1e-14 if lam[-1] > 0 else np.zeros(lam.shape, dtype=bool)
        p = V[:, keep] @ ((V[:, keep].T @ g) / lam[keep])
        t, improved = 1.0, False
        for _ in range(40):
            x_new = x - t * p
            f_new, g_new = fg(x_new)
            gn_new = float(np.max(np.abs(g_new)))
            if np.isfinite(f_new) and gn_new < gnorm:
                improved = True
                break
            t *= 0.5
        if not improved:
            break
        x, f, g, gnorm = x_new, f_new, g_new, gn_new
        steps += 1
    return x, f, gnorm, steps
