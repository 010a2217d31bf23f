"""Where the experiments find their data, and the loaders for images, text and LIBSVM files.

The shared data folder is, in order: ``--data-dir`` / the ``data_dir`` argument,
the environment variable ``AMOPT_SHARED_DATA``, ``../shared/data`` next to the
repository root, ``../shared/data`` from the working directory. Its layout::

    libsvm/a9a, libsvm/w8a, libsvm/mushrooms, libsvm/ijcnn1.trn.bz2,
    libsvm/variants/PanHaulin+CFNPM/phishing, libsvm/derived/madelon
    fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
    text/tinyshakespeare/input.txt

Fashion-MNIST is also found where the Debian package ``dataset-fashion-mnist``
installs it (``/usr/share/datasets/fashion-mnist``).
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
    "LIBSVM_SETS",
    "candidate_dirs",
    "find_fashion_mnist",
    "load_fashion_mnist",
    "load_logreg_problem",
    "load_text",
    "read_idx",
    "split_text",
]

#: Environment variable naming the shared data folder.
ENV_VAR = "AMOPT_SHARED_DATA"
#: Repository root (the folder holding ``amopt/``).
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Where the Debian package ``dataset-fashion-mnist`` puts the files.
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
#: The four IDX files of Fashion-MNIST.
FASHION_MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
#: Relative path of the tiny-shakespeare corpus in the shared data folder.
TEXT_FILE = Path("text/tinyshakespeare/input.txt")

#: The paper's LIBSVM sets available here: name -> (path under the data folder, loader kwargs).
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


def candidate_dirs(data_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """The shared data folders to search, most specific first.

    An explicit ``data_dir`` is the only candidate; otherwise ``$AMOPT_SHARED_DATA``
    (if set), ``<repo>/../shared/data`` and ``./../shared/data``.
    """
    if data_dir is not None:
        return [Path(data_dir).expanduser()]
    dirs = []
    env = os.environ.get(ENV_VAR)
    if env:
        dirs.append(Path(env).expanduser())
    dirs.append((REPO_ROOT.parent / "shared" / "data").resolve())
    cwd = (Path.cwd().parent / "shared" / "data").resolve()
    if cwd not in dirs:
        dirs.append(cwd)
    return dirs


def _where_to_put(what: str, relative: str, data_dir: Any, extra: str = "") -> str:
    looked = "\n".join(f"  - {d / relative}" for d in candidate_dirs(data_dir))
    return (
        f"{what} not found. Looked in:\n{looked}\n{extra}"
        f"Put the files at <data>/{relative} where <data> is the shared data folder, and "
        f"point to it with --data-dir DIR or the environment variable {ENV_VAR}=DIR "
        f"(default: ../shared/data next to the repository root)."
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

    Searches ``<data>/fashion-mnist`` (and ``<data>`` itself) for each candidate
    data folder, then ``/usr/share/datasets/fashion-mnist``.

    Raises
    ------
    FileNotFoundError
        With the folders searched and where to put the files.
    """
    places = []
    for d in candidate_dirs(data_dir):
        places += [d / "fashion-mnist", d]
    places.append(DEBIAN_FASHION_MNIST)
    for place in places:
        if all((place / f).is_file() for f in FASHION_MNIST_FILES):
            return place
    extra = (
        f"  - {DEBIAN_FASHION_MNIST} (Debian package dataset-fashion-mnist)\n"
        f"Needed files: {', '.join(FASHION_MNIST_FILES)} (IDX, gzip), from "
        "https://github.com/zalandoresearch/fashion-mnist or `apt-get install "
        "dataset-fashion-mnist`.\n"
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


def load_text(
    path: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> np.ndarray:
    """A text corpus as a uint8 byte array (byte-level vocabulary of 256).

    Parameters
    ----------
    path : path-like, optional
        A text file; default ``<data>/text/tinyshakespeare/input.txt``.
    data_dir : path-like, optional
        The shared data folder (see the module docstring).

    Raises
    ------
    FileNotFoundError
        With the places searched and where to put the file.
    """
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise FileNotFoundError(
                f"text file {p} not found; pass an existing file, or omit it to use "
                f"<data>/{TEXT_FILE} (tiny-shakespeare)"
            )
        return np.frombuffer(p.read_bytes(), dtype=np.uint8).copy()
    for d in candidate_dirs(data_dir):
        p = d / TEXT_FILE
        if p.is_file():
            return np.frombuffer(p.read_bytes(), dtype=np.uint8).copy()
    extra = "The corpus is karpathy/char-rnn data/tinyshakespeare/input.txt (1,115,394 bytes).\n"
    raise FileNotFoundError(_where_to_put("tiny-shakespeare", str(TEXT_FILE), data_dir, extra))


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
    spec: str, data_dir: str | os.PathLike[str] | None = None
) -> tuple[str, Any, str]:
    """Logistic regression (``l2 = 0``) on a LIBSVM set: a name of :data:`LIBSVM_SETS`,
    a file path, or a name bundled with amopt (``mushrooms``, ``a1a``).

    Returns
    -------
    name : str
        Short name for tables.
    problem : amopt.problems.LogisticRegression
    source : str
        The file that was read (or ``"bundled:<name>"``).

    Raises
    ------
    FileNotFoundError
        If a known set is missing from the data folder (and not bundled), or a
        path does not exist; the message says where to put the file.
    """
    from amopt.datasets import load_libsvm
    from amopt.problems import LogisticRegression

    if spec in LIBSVM_SETS:
        rel, kwargs = LIBSVM_SETS[spec]
        for d in candidate_dirs(data_dir):
            if (d / rel).is_file():
                name, path, source = spec, d / rel, str(d / rel)
                X, y = load_libsvm(path, **kwargs)
                break
        else:
            if spec in ("mushrooms", "a1a"):
                name, source = spec, f"bundled:{spec}"
                X, y = load_libsvm(spec)
            else:
                raise FileNotFoundError(_where_to_put(f"LIBSVM data set {spec!r}", rel, data_dir))
    elif Path(spec).expanduser().is_file():
        path = Path(spec).expanduser()
        name, source = path.name, str(path)
        X, y = load_libsvm(path)
    else:
        try:
            X, y = load_libsvm(spec, download=False)
        except (FileNotFoundError, KeyError, ValueError, OSError) as exc:
            known = ", ".join(LIBSVM_SETS)
            raise FileNotFoundError(
                f"{spec!r} is not an existing file, a set of the shared data folder ({known}) "
                f"or a bundled/cached amopt data set ({exc}). "
                + _where_to_put("it", "libsvm/<file>", data_dir)
            ) from exc
        name, source = spec, f"amopt.datasets:{spec}"
    return name, LogisticRegression(X, y), source
