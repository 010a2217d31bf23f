"""Loading LIBSVM / SVMlight files (through scikit-learn) and mapping their labels."""

from __future__ import annotations

import bz2
import gzip
import importlib.resources
import math
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ._download import fetch_libsvm
from ._registry import _REGISTRY, dataset_info

__all__ = ["LABEL_CONVENTIONS", "binary_labels", "class_indices", "load_libsvm"]

LabelMode = Literal["raw", "binary", "index"]


#: The two labels of each binary LIBSVM label convention, as ``(negative, positive)``.
LABEL_CONVENTIONS: dict[str, tuple[float, float]] = {
    "pm1": (-1.0, 1.0),
    "01": (0.0, 1.0),
    "12": (1.0, 2.0),
    "24": (2.0, 4.0),
}


def _check_label_values(y: np.ndarray) -> None:
    """Labels must be real numbers (or strings); float labels must be finite."""
    if y.dtype.kind not in "biufUS":
        raise TypeError(f"y must hold real numbers or strings (class labels), got dtype {y.dtype}")
    if y.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(y))
        if bad.size:
            raise ValueError(
                f"y contains NaN or infinite values, but labels must be finite: y[{bad[0]}] = "
                f"{float(y[bad[0]])!r} ({bad.size} non-finite in all)"
            )


def binary_labels(y: Any, *, positive: Any = None, convention: str | None = None) -> np.ndarray:
    """Map a label vector with at most two distinct values to ``±1`` (float64).

    LIBSVM files use ``±1``, ``{0, 1}``, ``{1, 2}`` or ``{2, 4}``. The rule:

    * ``convention`` given: its negative label maps to ``-1`` and its positive
      label to ``+1``, whichever of them occur (so a one-class file keeps its
      sign); other labels are an error.
    * ``positive`` given: that label maps to ``+1``, all others to ``-1``.
    * neither, two labels: the larger maps to ``+1``, the smaller to ``-1``.
    * neither, one label ``c``: ``-1`` if ``c`` is a number ``<= 0`` (the
      ``-1`` or ``0`` class of ``±1`` and ``{0, 1}`` files), else ``+1``. A
      file holding only ``1`` of a ``{1, 2}`` convention (or only ``2`` of
      ``{2, 4}``) cannot be told apart from the positive class of ``±1``:
      pass ``convention`` (or ``positive``) for those.

    Parameters
    ----------
    y : array_like, shape (n,)
        Labels with at most two distinct values: finite numbers, or strings.
    positive : scalar, optional
        The label mapped to ``+1``; all others map to ``-1``. It must occur
        in ``y`` unless ``y`` holds a single label (e.g. a test split with
        only negative samples).
    convention : {"pm1", "01", "12", "24"}, optional
        The label convention of the data, see :data:`LABEL_CONVENTIONS`.
        Exclusive with ``positive``.

    Returns
    -------
    numpy.ndarray of float64, values in ``{-1.0, +1.0}``

    Raises
    ------
    ValueError
        If ``y`` has more than two distinct labels, a non-finite label, a
        label outside ``convention``, or ``positive`` is absent from a
        two-label ``y``.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt.datasets import binary_labels
    >>> binary_labels(np.array([1.0, 2.0, 2.0, 1.0]))
    array([-1.,  1.,  1., -1.])
    >>> binary_labels(np.array([0, 1, 1]), positive=0)
    array([ 1., -1., -1.])
    >>> binary_labels(np.array([-1.0, -1.0])), binary_labels(np.array([0, 0]))
    (array([-1., -1.]), array([-1., -1.]))
    >>> binary_labels(np.array([1, 1]), convention="12")
    array([-1., -1.])
    """
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D, got shape {y.shape}")
    _check_label_values(y)
    if convention is not None and convention not in LABEL_CONVENTIONS:
        allowed = ", ".join(repr(c) for c in LABEL_CONVENTIONS)
        raise ValueError(f"convention must be one of {allowed} or None, got {convention!r}")
    if convention is not None and positive is not None:
        raise ValueError(
            f"pass positive or convention, not both (got positive={positive!r}, "
            f"convention={convention!r})"
        )
    classes = np.unique(y)
    if classes.size > 2:
        shown = ", ".join(str(c) for c in classes[:6]) + (", ..." if classes.size > 6 else "")
        raise ValueError(
            f"binary labels need at most 2 distinct values, got {classes.size} in y "
            f"({shown}); use a multiclass model or class_indices for multiclass data"
        )
    if convention is not None:
        neg, pos = LABEL_CONVENTIONS[convention]
        if y.dtype.kind not in "biuf" or np.any((classes != neg) & (classes != pos)):
            raise ValueError(
                f"y has labels {classes.tolist()}, but convention={convention!r} allows only "
                f"{neg:g} (mapped to -1) and {pos:g} (mapped to +1)"
            )
        return np.where(y == pos, 1.0, -1.0)
    if positive is None:
        if classes.size == 0:
            return np.zeros(0)
        if classes.size == 1:
            negative = y.dtype.kind in "biuf" and classes[0] <= 0
            return np.full(y.shape, -1.0 if negative else 1.0)
        positive = classes[-1]
    elif classes.size != 1 and not np.any(classes == positive):
        raise ValueError(f"positive={positive!r} does not occur in y (labels: {classes.tolist()})")
    return np.where(y == positive, 1.0, -1.0)


def class_indices(y: Any) -> tuple[np.ndarray, np.ndarray]:
    """Map arbitrary class labels to indices ``0..K-1``.

    Parameters
    ----------
    y : array_like, shape (n,)
        Class labels: finite numbers, or strings.

    Returns
    -------
    indices : numpy.ndarray of int64, shape (n,)
        ``classes[indices] == y``.
    classes : numpy.ndarray, shape (K,)
        The sorted distinct labels.

    Raises
    ------
    ValueError
        If ``y`` is not 1-D or holds a non-finite label.

    Examples
    --------
    >>> import numpy as np
    >>> from amopt.datasets import class_indices
    >>> idx, classes = class_indices(np.array([3.0, 1.0, 3.0, 2.0]))
    >>> idx, classes
    (array([2, 0, 2, 1]), array([1., 2., 3.]))
    """
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D, got shape {y.shape}")
    _check_label_values(y)
    classes, idx = np.unique(y, return_inverse=True)
    return idx.astype(np.int64), classes


def _open_text(path: Path):
    suffix = path.suffix.lower()
    if suffix == ".gz":
        return gzip.open(path, "rb")
    if suffix == ".bz2":
        return bz2.open(path, "rb")
    return open(path, "rb")


# scikit-learn's parser stores feature indices as C ints
_MAX_INDEX = 2**31 - 1


def _locate_error(path: Path, zero_based: bool | str, n_features: int | None) -> str | None:
    """Find the first line of a LIBSVM file that is not valid; describe it, or None.

    This is not a parser: it re-reads a file that scikit-learn refused, or
    whose parsed values are not all finite, only to point at the offending line.
    """
    min_index = 1 if zero_based is False else 0
    lowest, max_index, max_line = None, -1, None
    try:
        fh = _open_text(path)
    except OSError:  # pragma: no cover - the loader already opened it
        return None
    with fh:
        try:
            for lineno, raw in enumerate(fh, start=1):
                line = raw.split(b"#", 1)[0].strip()
                if not line:
                    continue
                shown = raw.decode("utf-8", "replace").rstrip("\r\n")
                shown = shown if len(shown) <= 80 else shown[:77] + "..."
                where = f"line {lineno}: {shown!r}"
                tokens = line.split()
                label = tokens[0].decode("utf-8", "replace")
                try:
                    label_value = float(tokens[0])
                except ValueError:
                    if b":" in tokens[0]:
                        return f"{where}: the label is missing (the line starts with {label!r})"
                    return f"{where}: label {label!r} is not a number"
                if not math.isfinite(label_value):
                    return f"{where}: label {label!r} is not finite (NaN and inf are not allowed)"
                feats = tokens[1:]
                if feats and feats[0].startswith(b"qid:"):
                    feats = feats[1:]
                prev = None
                for tok in feats:
                    text = tok.decode("utf-8", "replace")
                    parts = tok.split(b":")
                    if len(parts) != 2:
                        return f"{where}: token {text!r} is not of the form index:value"
                    try:
                        idx = int(parts[0])
                    except ValueError:
                        return f"{where}: feature index in {text!r} is not an integer"
                    try:
                        value = float(parts[1])
                    except ValueError:
                        return f"{where}: feature value in {text!r} is not a number"
                    if not math.isfinite(value):
                        return (
                            f"{where}: feature value in {text!r} is not finite (NaN and inf "
                            "are not allowed)"
                        )
                    if idx < min_index:
                        return (
                            f"{where}: invalid feature index {idx} (indices start at "
                            f"{min_index} with zero_based={zero_based!r})"
                        )
                    if idx > _MAX_INDEX:
                        return (
                            f"{where}: feature index {idx} is too large (the largest supported "
                            f"index is 2**31 - 1 = {_MAX_INDEX})"
                        )
                    if prev is not None and idx <= prev:
                        return (
                            f"{where}: feature indices must be sorted and unique "
                            f"({prev} then {idx})"
                        )
                    prev = idx
                    if idx > max_index:
                        max_index, max_line = idx, lineno
                    lowest = idx if lowest is None else min(lowest, idx)
        except (OSError, EOFError) as exc:
            return f"the file could not be decompressed ({exc})"
    if n_features is not None and max_index >= 0:
        one_based = zero_based is False or (
            zero_based == "auto" and lowest is not None and lowest > 0
        )
        needed = max_index if one_based else max_index + 1
        if needed > n_features:
            return (
                f"line {max_line}: feature index {max_index} needs n_features >= {needed}, "
                f"got n_features={n_features}"
            )
    return None


def _is_registry_name(path_or_name: Any) -> bool:
    """Registry names win over relative paths; a name with a ``/`` is always a path."""
    return isinstance(path_or_name, str) and path_or_name in _REGISTRY and "/" not in path_or_name


def _label_convention(path_or_name: Any, label_convention: str | None) -> str | None:
    """The binary label convention of a file: the argument, else the registry's, else None."""
    if label_convention is not None:
        if label_convention not in LABEL_CONVENTIONS:
            allowed = ", ".join(repr(c) for c in LABEL_CONVENTIONS)
            raise ValueError(
                f"label_convention must be one of {allowed} or None, got {label_convention!r}"
            )
        return label_convention
    if _is_registry_name(path_or_name):
        conv = _REGISTRY[path_or_name].labels
        return conv if conv in LABEL_CONVENTIONS else None
    return None


def _resolve(
    path_or_name: str | os.PathLike[str],
    cache_dir: Any,
    base_url: str | None,
    download: bool,
    verify: bool,
):
    """Return ``(path, registry entry or None)``; registry names win over relative paths."""
    is_name = _is_registry_name(path_or_name)
    if isinstance(path_or_name, os.PathLike) or (isinstance(path_or_name, str) and not is_name):
        path = Path(path_or_name).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"{str(path_or_name)!r} is neither an existing file nor a registered LIBSVM "
                "data set name (see amopt.datasets.list_datasets())"
            )
        return path, None
    if not isinstance(path_or_name, str):
        raise TypeError(
            f"path_or_name must be a str or path-like, got {type(path_or_name).__name__}"
        )
    info = dataset_info(path_or_name)
    if info.bundled is not None:
        res = importlib.resources.files("amopt.datasets").joinpath("data", info.bundled)
        if res.is_file():
            return Path(str(res)), info
    return fetch_libsvm(
        info.name, cache_dir=cache_dir, base_url=base_url, download=download, verify=verify
    ), info


def load_libsvm(
    path_or_name: str | os.PathLike[str],
    *,
    n_features: int | None = None,
    zero_based: bool | Literal["auto"] = "auto",
    labels: LabelMode = "raw",
    label_convention: str | None = None,
    dtype: Any = np.float64,
    cache_dir: str | os.PathLike[str] | None = None,
    base_url: str | None = None,
    download: bool = True,
    verify: bool = True,
) -> tuple[Any, np.ndarray]:
    """Load a LIBSVM/SVMlight file as a CSR matrix and a label vector.

    Parsing is done by :func:`sklearn.datasets.load_svmlight_file` (install
    with ``pip install amopt[data]``); ``.gz`` and ``.bz2`` files are read
    directly. Every value and label must be a finite number.

    Parameters
    ----------
    path_or_name : str or path-like
        A file path, or a registry name (see :func:`list_datasets`). Names
        resolve to the copy bundled with amopt (``"mushrooms"``, ``"a1a"``),
        else to the cache directory, downloading the file once if needed. A
        bare registry name always means the registry: load a local file of
        the same name as ``"./a9a"`` or a :class:`pathlib.Path`.
    n_features : int, optional
        Number of columns. Defaults to the registry's count for names and to
        the largest index present for paths; pass it for test splits, which
        may miss the last features.
    zero_based : bool or "auto", default "auto"
        Whether indices start at 0. ``"auto"`` means: the registry's
        convention for names, scikit-learn's detection for paths (zero-based
        iff some index 0 occurs).
    labels : {"raw", "binary", "index"}, default "raw"
        ``"raw"``: labels as in the file; ``"binary"``: mapped to ``±1`` by
        :func:`binary_labels`; ``"index"``: class indices ``0..K-1`` (int64)
        by :func:`class_indices`.
    label_convention : {"pm1", "01", "12", "24"}, optional
        Label convention for ``labels="binary"``; defaults to the registry's
        for names. With a convention a file holding one class keeps its sign
        (only ``1`` in a ``{1, 2}`` file is ``-1``); without one the rule of
        :func:`binary_labels` applies (a single class ``c`` is ``-1`` iff
        ``c <= 0``).
    dtype : numpy floating dtype, default float64
        dtype of ``X``.
    cache_dir, base_url, download, verify
        Passed to :func:`fetch_libsvm` for registry names.

    Returns
    -------
    X : scipy.sparse.csr_matrix, shape (n_samples, n_features)
    y : numpy.ndarray, shape (n_samples,)

    Raises
    ------
    ImportError
        If scikit-learn is not installed.
    FileNotFoundError
        If the path does not exist or the name is unknown.
    ValueError
        For a malformed or empty file (a bad token, a missing label, a
        non-finite value or label, a feature index above ``2**31 - 1``); the
        message names the file and, where the problem is on one line, the
        line number and its content.
    DownloadError, ChecksumError
        See :func:`fetch_libsvm`.

    Examples
    --------
    >>> from amopt.datasets import load_libsvm
    >>> X, y = load_libsvm("mushrooms", labels="binary")  # bundled: no network
    >>> X.shape, sorted(set(y.tolist()))
    ((8124, 112), [-1.0, 1.0])
    """
    try:
        from sklearn.datasets import load_svmlight_file
    except ImportError as exc:
        raise ImportError(
            "amopt.datasets.load_libsvm needs scikit-learn to parse LIBSVM files; install it "
            "with `pip install amopt[data]` (or `pip install scikit-learn`)"
        ) from exc

    if n_features is not None and (
        isinstance(n_features, bool)
        or not isinstance(n_features, int | np.integer)
        or not 1 <= n_features <= _MAX_INDEX + 1
    ):
        raise ValueError(
            f"n_features must be a positive integer (at most 2**31) or None, got {n_features!r}"
        )
    if not (
        isinstance(zero_based, bool) or (isinstance(zero_based, str) and zero_based == "auto")
    ):
        raise ValueError(f"zero_based must be True, False or 'auto', got {zero_based!r}")
    if labels not in ("raw", "binary", "index"):
        raise ValueError(f"labels must be 'raw', 'binary' or 'index', got {labels!r}")
    try:
        float_dtype = np.dtype(dtype).kind == "f"
    except TypeError:
        float_dtype = False
    if not float_dtype:
        raise ValueError(f"dtype must be a floating dtype such as numpy.float64, got {dtype!r}")
    convention = _label_convention(path_or_name, label_convention)

    path, info = _resolve(path_or_name, cache_dir, base_url, download, verify)
    if info is not None:
        if n_features is None:
            n_features = info.n_features
        if zero_based == "auto":
            zero_based = info.zero_based
    try:
        X, y = load_svmlight_file(
            str(path),
            n_features=None if n_features is None else int(n_features),
            zero_based=zero_based,
            dtype=dtype,
        )
    except (ValueError, OverflowError, OSError, EOFError) as exc:
        detail = _locate_error(path, zero_based, n_features)
        where = f"{path}: {detail}" if detail else f"{path}"
        raise ValueError(f"malformed LIBSVM file {where} (scikit-learn: {exc})") from exc
    if X.shape[0] == 0:
        raise ValueError(
            f"LIBSVM file {path} contains no samples (it is empty, or holds only blank lines "
            "and comments)"
        )
    if not (np.all(np.isfinite(X.data)) and np.all(np.isfinite(y))):
        detail = _locate_error(path, zero_based, n_features)
        if detail is None:  # a value that only overflows in a narrow dtype such as float32
            detail = f"a value does not fit in {np.dtype(dtype).name}"
        raise ValueError(f"malformed LIBSVM file {path}: {detail}")
    X = X.tocsr()
    X.sort_indices()
    if labels == "binary":
        try:
            y = binary_labels(y, convention=convention)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    elif labels == "index":
        y = class_indices(y)[0]
    return X, y
