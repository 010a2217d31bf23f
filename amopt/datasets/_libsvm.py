"""Loading LIBSVM / SVMlight files (through scikit-learn) and mapping their labels."""

from __future__ import annotations

import bz2
import gzip
import importlib.resources
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ._download import ChecksumError, fetch_libsvm
from ._registry import _REGISTRY, dataset_info

__all__ = [
    "LABEL_CONVENTIONS",
    "binary_labels",
    "class_indices",
    "load_libsvm",
    "load_libsvm_files",
]

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
        iff some index 0 occurs). A split that happens not to use index 0 is
        then read as one-based: read files that belong together (a train/test
        pair) with :func:`load_libsvm_files`, which decides once for all.
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
        See :func:`fetch_libsvm`. Also ``ChecksumError`` when a registry name's
        file does not hold the registry's number of samples (unless
        ``verify=False``).

    Examples
    --------
    >>> from amopt.datasets import load_libsvm
    >>> X, y = load_libsvm("mushrooms", labels="binary")  # bundled: no network
    >>> X.shape, sorted(set(y.tolist()))
    ((8124, 112), [-1.0, 1.0])
    """
    return _load(
        [path_or_name],
        n_features=n_features,
        zero_based=zero_based,
        labels=labels,
        label_convention=label_convention,
        dtype=dtype,
        cache_dir=cache_dir,
        base_url=base_url,
        download=download,
        verify=verify,
    )[0]


def load_libsvm_files(
    paths_or_names: Sequence[str | os.PathLike[str]],
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
) -> list[Any]:
    """Load LIBSVM files that belong together (a train/test pair) with one set of decisions.

    As :func:`sklearn.datasets.load_svmlight_files`: every file gets the same
    number of columns, and ``zero_based="auto"`` is decided once for all of
    them, so that a split whose indices happen not to include 0 is not read
    with its columns shifted against the other. The labels are mapped with one
    decision too: ``labels="index"`` numbers the classes of all files together
    (a split missing a class keeps the others' indices) and ``labels="binary"``
    without a convention takes the larger label over all files as ``+1``.

    Parameters
    ----------
    paths_or_names : sequence of str or path-like
        File paths or registry names, as for :func:`load_libsvm`.
    n_features : int, optional
        Number of columns of every matrix. Defaults to the largest registry
        count among the names, else to the largest index over all files.
    zero_based : bool or "auto", default "auto"
        ``"auto"``: the registry's convention where a name is given (the
        names must agree), else zero-based iff index 0 occurs in some file.
    labels, label_convention, dtype, cache_dir, base_url, download, verify
        As for :func:`load_libsvm`; a ``label_convention`` applies to every
        file, else each name's registry convention to its file.

    Returns
    -------
    list
        ``[X_1, y_1, X_2, y_2, ...]``: a CSR matrix and a label vector per file,
        in the order given (the form of ``load_svmlight_files``).

    Raises
    ------
    ValueError
        As :func:`load_libsvm`, naming the file; also when the registry names
        given disagree on the index base.

    Examples
    --------
    >>> from amopt.datasets import load_libsvm_files
    >>> X1, y1, X2, y2 = load_libsvm_files(["a1a", "mushrooms"], n_features=123)
    >>> X1.shape, X2.shape
    ((1605, 123), (8124, 123))
    """
    if isinstance(paths_or_names, str | os.PathLike) or not isinstance(paths_or_names, Sequence):
        raise TypeError(
            "paths_or_names must be a list or tuple of paths or registry names, got "
            f"{type(paths_or_names).__name__} (use load_libsvm for one file)"
        )
    if len(paths_or_names) == 0:
        raise ValueError("paths_or_names must name at least one file, got an empty sequence")
    pairs = _load(
        list(paths_or_names),
        n_features=n_features,
        zero_based=zero_based,
        labels=labels,
        label_convention=label_convention,
        dtype=dtype,
        cache_dir=cache_dir,
        base_url=base_url,
        download=download,
        verify=verify,
    )
    return [a for pair in pairs for a in pair]


def _load(
    paths_or_names: list,
    *,
    n_features: Any,
    zero_based: Any,
    labels: Any,
    label_convention: Any,
    dtype: Any,
    cache_dir: Any,
    base_url: Any,
    download: bool,
    verify: bool,
) -> list[tuple[Any, np.ndarray]]:
    """The files read with one index base, one width and one label mapping."""
    try:
        from sklearn.datasets import load_svmlight_files
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
    conventions = [_label_convention(f, label_convention) for f in paths_or_names]

    resolved = [_resolve(f, cache_dir, base_url, download, verify) for f in paths_or_names]
    paths = [path for path, _ in resolved]
    infos = [info for _, info in resolved if info is not None]
    if infos:
        if n_features is None:
            n_features = max(info.n_features for info in infos)
        if zero_based == "auto":
            bases = {info.zero_based for info in infos}
            if len(bases) > 1:
                names = ", ".join(f"{i.name!r} (zero_based={i.zero_based})" for i in infos)
                raise ValueError(
                    f"the registry entries read together disagree on the index base: {names}; "
                    "pass zero_based=True or False"
                )
            zero_based = bases.pop()
    try:
        parsed = load_svmlight_files(
            [str(path) for path in paths],
            n_features=None if n_features is None else int(n_features),
            zero_based=zero_based,
            dtype=dtype,
        )
    except (ValueError, OverflowError, OSError, EOFError) as exc:
        where = str(paths[0]) if len(paths) == 1 else "among " + ", ".join(map(str, paths))
        for path in paths:  # the first file with a line at fault, if one can be pointed at
            detail = _locate_error(path, zero_based, n_features)
            if detail is not None:
                where = f"{path}: {detail}"
                break
        raise ValueError(f"malformed LIBSVM file {where} (scikit-learn: {exc})") from exc
    pairs = []
    for k, (path, info) in enumerate(resolved):
        X, y = parsed[2 * k], parsed[2 * k + 1]
        if X.shape[0] == 0:
            raise ValueError(
                f"LIBSVM file {path} contains no samples (it is empty, or holds only blank "
                "lines and comments)"
            )
        if not (np.all(np.isfinite(X.data)) and np.all(np.isfinite(y))):
            detail = _locate_error(path, zero_based, n_features)
            if detail is None:  # a value that only overflows in a narrow dtype such as float32
                detail = f"a value does not fit in {np.dtype(dtype).name}"
            raise ValueError(f"malformed LIBSVM file {path}: {detail}")
        if verify and info is not None and X.shape[0] != info.n_samples:
            raise ChecksumError(
                f"{path} holds {X.shape[0]} samples, but the registry says {info.name!r} has "
                f"{info.n_samples}: it is truncated or corrupted; delete it to download it "
                "again, or pass verify=False to use it anyway"
            )
        X = X.tocsr()
        X.sort_indices()
        pairs.append((X, y))
    ys = [y for _, y in pairs]
    if labels == "binary":
        positive = None
        if all(c is None for c in conventions):
            union = np.unique(np.concatenate(ys))
            if union.size == 2:  # the larger label of all files is +1 in every file
                positive = union[-1]
            elif union.size > 2 and len(ys) > 1:
                shown = ", ".join(str(c) for c in union[:6]) + (", ..." if union.size > 6 else "")
                raise ValueError(
                    f"binary labels need at most 2 distinct values over the files read "
                    f"together, got {union.size} ({shown}); pass label_convention, or use "
                    "labels='index' for multiclass data"
                )
        mapped = []
        for (path, _), y, conv in zip(resolved, ys, conventions, strict=True):
            try:
                mapped.append(
                    binary_labels(y, convention=conv, positive=None if conv else positive)
                )
            except ValueError as exc:
                raise ValueError(f"{path}: {exc}") from None
        ys = mapped
    elif labels == "index":
        classes = class_indices(np.concatenate(ys))[1]
        ys = [np.searchsorted(classes, y).astype(np.int64) for y in ys]
    return [(X, y) for (X, _), y in zip(pairs, ys, strict=True)]
