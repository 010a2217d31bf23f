"""Where the experiments find their data, and the loaders for images, text and LIBSVM files.

Every data set lives in one data folder ``<data>``: the ``--data-dir`` option (the
``data_dir`` argument), else the environment variable ``AMOPT_DATA_DIR``, else the
user cache directory (``$AMOPT_CACHE_DIR``, else ``~/.cache/amopt`` on Linux; see
:func:`amopt.datasets.get_cache_home`). It is the folder :mod:`amopt.datasets`
caches its LIBSVM downloads in. The experiments only read it, apart from downloads
(``--no-download`` turns them off): reference solutions ``f*`` are cached in the
user cache directory, never here (``docs/caching.md``). Its layout::

    <data>/libsvm/a9a, libsvm/w8a, libsvm/mushrooms     LIBSVM files, original names
    <data>/libsvm/ijcnn1.trn.bz2                        ijcnn1 (train + validation)
    <data>/libsvm/variants/PanHaulin+CFNPM/phishing     phishing, zero-based indices
    <data>/libsvm/derived/madelon                       madelon (UCI train set)
    <data>/fashion-mnist/train-images-idx3-ubyte.gz     Fashion-MNIST, the four IDX files
                        /train-labels-idx1-ubyte.gz
                        /t10k-images-idx3-ubyte.gz
                        /t10k-labels-idx1-ubyte.gz
    <data>/text/tinyshakespeare/input.txt               tiny-shakespeare (1,115,394 bytes)

A LIBSVM set missing there is loaded through :func:`amopt.datasets.load_libsvm`
by its registry name: the copies bundled with amopt (``mushrooms``, ``a1a``), or
a download from the LIBSVM site into ``<data>/libsvm/``. tiny-shakespeare is
downloaded into its place when missing (checked by SHA-256). Fashion-MNIST is
also found where the Debian package ``dataset-fashion-mnist`` installs it
(``/usr/share/datasets/fashion-mnist``). ``--no-download`` (``download=False``)
turns every download off.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ENV_VAR",
    "FASHION_MNIST_FILES",
    "LAYOUT",
    "LIBSVM_SETS",
    "TEXT_SHA256",
    "TEXT_URL",
    "data_folder",
    "fetch_text",
    "find_fashion_mnist",
    "load_fashion_mnist",
    "load_logreg_problem",
    "load_text",
    "read_idx",
    "split_text",
]

#: Environment variable naming the data folder (shared with :mod:`amopt.datasets`).
ENV_VAR = "AMOPT_DATA_DIR"
#: Where the Debian package ``dataset-fashion-mnist`` puts the files.
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
#: The four IDX files of Fashion-MNIST.
FASHION_MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
#: Relative path of the tiny-shakespeare corpus in the data folder.
TEXT_FILE = Path("text/tinyshakespeare/input.txt")
#: The tiny-shakespeare corpus of karpathy/char-rnn, and its SHA-256.
TEXT_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TEXT_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
#: The expected layout of the data folder, as shown in error messages.
LAYOUT = (
    "libsvm/<LIBSVM file> (e.g. libsvm/a9a), fashion-mnist/<the four *-ubyte.gz IDX files>, "
    "text/tinyshakespeare/input.txt"
)

#: The paper's LIBSVM sets: name -> (path under the data folder, loader kwargs).
LIBSVM_SETS: dict[str, tuple[str, dict[str, Any]]] = {
    "a9a": ("libsvm/a9a", {"n_features": 123}),
    "w8a": ("libsvm/w8a", {"n_features": 300}),
    "mushrooms": ("libsvm/mushrooms", {"n_features": 112}),
    "phishing": (
        "libsvm/variants/PanHaulin+CFNPM/phishing",
        {"n_features": 68, "zero_based": True},
    ),
    "ijcnn1": ("libsvm/ijcnn1.trn.bz2", {"n_features": 22}),
    "madelon": ("libsvm/derived/madelon", {"n_features": 500}),
}
#: The samples each file of LIBSVM_SETS holds (the LIBSVM pages' counts; phishing's
#: variant is the 70% part of a split): a copy that holds fewer is truncated.
_LIBSVM_SAMPLES = {
    "a9a": 32561,
    "w8a": 49749,
    "mushrooms": 8124,
    "phishing": 7738,
    "ijcnn1": 49990,
    "madelon": 2000,
}


def data_folder(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The data folder: ``data_dir``, else ``$AMOPT_DATA_DIR``, else the user cache directory.

    Examples
    --------
    >>> str(data_folder("/tmp/amopt-data"))
    '/tmp/amopt-data'
    """
    from amopt.datasets import get_data_home

    return get_data_home(data_dir)


def _where_to_put(what: str, relative: str, data_dir: Any, extra: str = "") -> str:
    folder = data_folder(data_dir)
    return (
        f"{what} not found at {folder / relative}.\n{extra}"
        f"Put the data at <data>/{relative}, where <data> is the data folder: --data-dir DIR "
        f"(data_dir= in Python), else the environment variable {ENV_VAR}=DIR, else "
        f"the user cache directory "
        f"(now: {folder}). Layout of <data>: {LAYOUT}."
    )


# --------------------------------------------------------------------------- Fashion-MNIST


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (optionally gzip-compressed) into a NumPy array.

    Parameters
    ----------
    path : path-like
        ``*-idx1-ubyte[.gz]`` (labels) or ``*-idx3-ubyte[.gz]`` (images).

    Returns
    -------
    numpy.ndarray
        uint8 array of the shape stored in the header.

    Raises
    ------
    ValueError
        If the header is not an unsigned-byte IDX header or the size disagrees.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (header {raw[:4]!r})")
    ndim = raw[3]
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    offset = 4 + 4 * ndim
    size = int(np.prod(dims))
    if len(raw) - offset != size:
        raise ValueError(
            f"{path}: header says {dims} ({size} bytes), file has {len(raw) - offset}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(dims)


def find_fashion_mnist(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding the four Fashion-MNIST IDX files.

    Searches ``<data>/fashion-mnist``, ``<data>`` itself, then
    ``/usr/share/datasets/fashion-mnist`` (Debian package ``dataset-fashion-mnist``).

    Raises
    ------
    FileNotFoundError
        With the folders searched, the files needed and where to put them.
    """
    folder = data_folder(data_dir)
    places = [folder / "fashion-mnist", folder, DEBIAN_FASHION_MNIST]
    for place in places:
        if all((place / f).is_file() for f in FASHION_MNIST_FILES):
            return place
    extra = (
        f"Also looked in {folder} and {DEBIAN_FASHION_MNIST} (Debian package "
        f"dataset-fashion-mnist). Needed files: {', '.join(FASHION_MNIST_FILES)} (IDX, gzip), "
        "from https://github.com/zalandoresearch/fashion-mnist (data/fashion/) or "
        "`apt-get install dataset-fashion-mnist`.\n"
    )
    raise FileNotFoundError(_where_to_put("Fashion-MNIST", "fashion-mnist/", data_dir, extra))


def load_fashion_mnist(
    data_dir: str | os.PathLike[str] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fashion-MNIST as uint8 arrays, read with NumPy and gzip (no torchvision).

    Returns
    -------
    x_train : numpy.ndarray, shape (60000, 28, 28), uint8
    y_train : numpy.ndarray, shape (60000,), uint8, values 0..9
    x_test : numpy.ndarray, shape (10000, 28, 28), uint8
    y_test : numpy.ndarray, shape (10000,), uint8

    Raises
    ------
    FileNotFoundError
        If the files are in none of the searched folders (the message says where to put them).
    ValueError
        If images and labels disagree in count or a label is outside 0..9.
    """
    folder = find_fashion_mnist(data_dir)
    arrays = [read_idx(folder / f) for f in FASHION_MNIST_FILES]
    x_train, y_train, x_test, y_test = arrays
    for x, y, name in ((x_train, y_train, "train"), (x_test, y_test, "t10k")):
        if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise ValueError(
                f"Fashion-MNIST {name}: images {x.shape} and labels {y.shape} do not match"
            )
        if y.size and int(y.max()) > 9:
            raise ValueError(f"Fashion-MNIST {name}: label {int(y.max())} outside 0..9")
    return x_train, y_train, x_test, y_test


# --------------------------------------------------------------------------- text


def fetch_text(
    data_dir: str | os.PathLike[str] | None = None, *, download: bool = True, timeout: float = 60.0
) -> Path:
    """Path of ``<data>/text/tinyshakespeare/input.txt``, downloading it once if missing.

    The download comes from :data:`TEXT_URL` and must have the SHA-256
    :data:`TEXT_SHA256`; it is written atomically.

    Raises
    ------
    FileNotFoundError
        If the file is missing and ``download`` is false, or the download failed
        (offline, wrong checksum); the message says where to put the file.
    """
    from amopt.datasets import ChecksumError, DownloadError
    from amopt.datasets._download import _download

    path = data_folder(data_dir) / TEXT_FILE
    if path.is_file():
        return path
    extra = f"tiny-shakespeare is {TEXT_URL} (1,115,394 bytes, sha256 {TEXT_SHA256}).\n"
    if not download:
        extra = "Downloading is off (--no-download). " + extra
        raise FileNotFoundError(_where_to_put("tiny-shakespeare", str(TEXT_FILE), data_dir, extra))
    try:
        return _download(TEXT_URL, path, TEXT_SHA256, timeout)
    except (DownloadError, ChecksumError) as exc:
        extra = f"The download failed: {exc}\n"
        raise FileNotFoundError(
            _where_to_put("tiny-shakespeare", str(TEXT_FILE), data_dir, extra)
        ) from exc


def load_text(
    path: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    download: bool = True,
) -> np.ndarray:
    """A text corpus as a uint8 byte array (byte-level vocabulary of 256).

    Parameters
    ----------
    path : path-like, optional
        A text file; default ``<data>/text/tinyshakespeare/input.txt`` (see
        :func:`fetch_text`).
    data_dir : path-like, optional
        The data folder (see the module docstring).
    download : bool, default True
        Download tiny-shakespeare when it is missing.

    Raises
    ------
    FileNotFoundError
        With the place searched, the layout and where to put the file.
    """
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise FileNotFoundError(
                f"text file {p} not found; pass an existing file, or omit it to use "
                f"<data>/{TEXT_FILE} (tiny-shakespeare)"
            )
    else:
        p = fetch_text(data_dir, download=download)
    return np.frombuffer(p.read_bytes(), dtype=np.uint8).copy()


def split_text(data: np.ndarray, val_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous train / held-out split: the last ``val_fraction`` of the bytes is held out.

    Examples
    --------
    >>> train, val = split_text(np.arange(100, dtype=np.uint8), 0.1)
    >>> train.shape, val.shape, int(val[0])
    ((90,), (10,), 90)
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction!r}")
    cut = int(round(len(data) * (1.0 - val_fraction)))
    return data[:cut], data[cut:]


# --------------------------------------------------------------------------- LIBSVM


def load_logreg_problem(
    spec: str, data_dir: str | os.PathLike[str] | None = None, *, download: bool = True
) -> tuple[str, Any, str]:
    """Logistic regression (``l2 = 0``) on a LIBSVM set.

    Parameters
    ----------
    spec : str
        A name of :data:`LIBSVM_SETS` (read from ``<data>/<its path>`` when
        there), a file path, or a name of the :mod:`amopt.datasets` registry
        (bundled ``mushrooms`` / ``a1a``; others are downloaded into
        ``<data>/libsvm/``).
    data_dir : path-like, optional
        The data folder (see the module docstring).
    download : bool, default True
        Allow the registry to download a missing file.

    Returns
    -------
    name : str
        Short name for tables.
    problem : amopt.problems.LogisticRegression
    source : str
        The file that was read, ``"bundled:<name>"``, or ``"amopt.datasets:<name>"``.

    Raises
    ------
    FileNotFoundError
        If the set is in neither place and cannot be downloaded, or a path does
        not exist; the message says where to put the file.
    """
    from amopt.datasets import ChecksumError, dataset_info, load_libsvm
    from amopt.problems import LogisticRegression

    folder = data_folder(data_dir)
    if spec in LIBSVM_SETS and (folder / LIBSVM_SETS[spec][0]).is_file():
        rel, kwargs = LIBSVM_SETS[spec]
        X, y = load_libsvm(folder / rel, **kwargs)
        if X.shape[0] != _LIBSVM_SAMPLES[spec]:
            raise ChecksumError(
                f"{folder / rel} holds {X.shape[0]} samples, but {spec} has "
                f"{_LIBSVM_SAMPLES[spec]}: it is truncated or corrupted; replace it with a "
                "whole copy"
            )
        return spec, LogisticRegression(X, y), str(folder / rel)
    path = Path(spec).expanduser()
    if spec not in LIBSVM_SETS and path.is_file():
        X, y = load_libsvm(path)
        return path.name, LogisticRegression(X, y), str(path)
    try:
        info = dataset_info(spec)
    except KeyError as exc:
        known = ", ".join(LIBSVM_SETS)
        raise FileNotFoundError(
            f"{spec!r} is not an existing file, a set of the data folder ({known}) or a "
            f"registered amopt.datasets name ({exc.args[0]}). "
            + _where_to_put("it", "libsvm/<file>", data_dir)
        ) from None
    try:
        X, y = load_libsvm(spec, cache_dir=data_dir, download=download)
    except OSError as exc:  # missing with download off, DownloadError, ChecksumError
        rel = LIBSVM_SETS[spec][0] if spec in LIBSVM_SETS else f"libsvm/{info.file_name}"
        extra = f"Loading it through amopt.datasets failed: {exc}\n"
        raise FileNotFoundError(
            _where_to_put(f"LIBSVM data set {spec!r}", rel, data_dir, extra)
        ) from exc
    source = f"bundled:{spec}" if info.bundled else f"amopt.datasets:{spec}"
    return spec, LogisticRegression(X, y), source
