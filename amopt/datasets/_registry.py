"""Registry of the standard LIBSVM data sets: where they live and what they contain."""

from __future__ import annotations

import csv
import dataclasses
import importlib.resources
import io
from typing import Any, Literal

__all__ = ["LIBSVM_URL", "LibsvmDataset", "dataset_info", "list_datasets", "register_dataset"]

#: Root of the LIBSVM data-set pages (Chang & Lin, "LIBSVM: a library for support vector
#: machines", https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/).
LIBSVM_URL = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/"

LabelConvention = Literal["pm1", "01", "12", "24", "multiclass"]
_LABEL_CONVENTIONS = ("pm1", "01", "12", "24", "multiclass")


@dataclasses.dataclass(frozen=True)
class LibsvmDataset:
    """One entry of the LIBSVM registry.

    Attributes
    ----------
    name : str
        Registry key, e.g. ``"a9a"`` or ``"a9a.t"`` (test split).
    path : str
        Path of the file below :data:`LIBSVM_URL`, e.g. ``"binary/a9a"``; the
        download URL is ``base_url + path``.
    n_samples, n_features : int
        Shape stated on the LIBSVM page. ``n_features`` is passed to the
        loader, because test splits and small subsets omit the largest indices.
    labels : {"pm1", "01", "12", "24", "multiclass"}
        Label convention of the file: ``±1``, ``{0, 1}``, ``{1, 2}``,
        ``{2, 4}``, or class ids (multiclass).
    n_classes : int
        Number of distinct labels (2 for binary sets).
    sha256 : str or None
        SHA-256 of the file as served (compressed bytes for ``.bz2``), where a
        verified copy was available to us. ``None``: the SHA-256 of the first
        download is recorded next to the file and checked afterwards (see
        :func:`fetch_libsvm`).
    bundled : str or None
        File name under ``amopt/datasets/data/`` when a compressed copy ships
        with the package (then no download is ever needed).
    zero_based : bool
        True when feature indices start at 0 (all original LIBSVM files are
        one-based).
    note : str
        Free-text provenance note.

    Raises
    ------
    ValueError
        If a field is invalid (e.g. ``n_features < 1``, an unknown ``labels``
        convention, a ``sha256`` that is not 64 hexadecimal digits).

    Examples
    --------
    >>> from amopt.datasets import LibsvmDataset
    >>> entry = LibsvmDataset("toy", "binary/toy", n_samples=2, n_features=2, labels="pm1")
    >>> entry.file_name, entry.url("https://mirror.example/libsvm")
    ('toy', 'https://mirror.example/libsvm/binary/toy')
    >>> LibsvmDataset("toy", "binary/toy", n_samples=2, n_features=0, labels="pm1")
    Traceback (most recent call last):
    ...
    ValueError: LibsvmDataset n_features must be a positive int, got 0
    """

    name: str
    path: str
    n_samples: int
    n_features: int
    labels: LabelConvention
    n_classes: int = 2
    sha256: str | None = None
    bundled: str | None = None
    zero_based: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        def bad(field: str, value: object, allowed: str) -> ValueError:
            return ValueError(f"LibsvmDataset {field} must be {allowed}, got {value!r}")

        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise bad("name", self.name, "a non-empty str without '/'")
        if (
            not isinstance(self.path, str)
            or not self.path.rsplit("/", 1)[-1]
            or self.path.startswith("/")
            or ".." in self.path.split("/")
        ):
            raise bad("path", self.path, "a relative file path such as 'binary/a9a'")
        for field in ("n_samples", "n_features"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(field, value, "a positive int")
        if self.labels not in _LABEL_CONVENTIONS:
            raise bad("labels", self.labels, " or ".join(repr(c) for c in _LABEL_CONVENTIONS))
        if isinstance(self.n_classes, bool) or not isinstance(self.n_classes, int):
            raise bad("n_classes", self.n_classes, "an int")
        if (self.labels == "multiclass") != (self.n_classes > 2) or self.n_classes < 2:
            raise bad(
                "n_classes", self.n_classes, f"2 for labels={self.labels!r}, and > 2 only for "
                "labels='multiclass'"
            )  # fmt: skip
        if self.sha256 is not None and not (
            isinstance(self.sha256, str)
            and len(self.sha256) == 64
            and all(c in "0123456789abcdef" for c in self.sha256)
        ):
            raise bad("sha256", self.sha256, "None or 64 lowercase hexadecimal digits")

    @property
    def file_name(self) -> str:
        """Name of the file in the cache directory (the last part of ``path``)."""
        return self.path.rsplit("/", 1)[-1]

    def url(self, base_url: str | None = None) -> str:
        """Download URL, below ``base_url`` (a mirror) or the LIBSVM site."""
        base = LIBSVM_URL if base_url is None else base_url
        return base.rstrip("/") + "/" + self.path


def _read_entries() -> list[LibsvmDataset]:
    """The rows of ``registry.csv``: the fields of :class:`LibsvmDataset`, one row per set.

    An empty ``sha256`` or ``bundled`` is None. The sha256 values were computed on the
    copies in the project's offline data directory, which are the LIBSVM files as
    redistributed by konstmish/opt_methods, PanHaulin/CFNPM and baowj-678/Machine-Learning
    (see that directory's README); entries whose only copy was re-compressed or
    re-encoded by a third party carry no checksum.
    """
    table = importlib.resources.files(__package__).joinpath("registry.csv")
    entries = []
    for row in csv.DictReader(io.StringIO(table.read_text(encoding="utf-8"))):
        values: dict[str, Any] = dict(row)
        for key in ("n_samples", "n_features", "n_classes"):
            values[key] = int(row[key])
        for key in ("sha256", "bundled"):
            values[key] = row[key] or None
        entries.append(LibsvmDataset(**values))
    return entries


_ENTRIES = _read_entries()

_REGISTRY: dict[str, LibsvmDataset] = {e.name: e for e in _ENTRIES}


def list_datasets() -> list[str]:
    """Names of the registered LIBSVM data sets, sorted.

    Examples
    --------
    >>> from amopt.datasets import list_datasets
    >>> "a9a" in list_datasets() and "mushrooms" in list_datasets()
    True
    """
    return sorted(_REGISTRY)


def dataset_info(name: str) -> LibsvmDataset:
    """The registry entry of ``name``.

    Raises
    ------
    KeyError
        If ``name`` is not registered (the message lists the known names).

    Examples
    --------
    >>> from amopt.datasets import dataset_info
    >>> info = dataset_info("a9a")
    >>> info.n_samples, info.n_features, info.labels
    (32561, 123, 'pm1')
    >>> info.url()
    'https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary/a9a'
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown LIBSVM data set {name!r}; registered names: {', '.join(list_datasets())}"
        ) from None


def register_dataset(entry: LibsvmDataset, *, overwrite: bool = False) -> None:
    """Add ``entry`` to the registry (e.g. a local mirror's file or a new set).

    Parameters
    ----------
    entry : LibsvmDataset
        The new entry (its fields are checked when it is created).
    overwrite : bool, default False
        Replace an existing entry of the same name.

    Raises
    ------
    ValueError
        If a data set of that name exists and ``overwrite`` is false.

    Examples
    --------
    A file placed by hand in a data folder, registered with its SHA-256, is then
    found offline:

    >>> import pathlib, tempfile
    >>> from amopt.datasets import (
    ...     LibsvmDataset, fetch_libsvm, register_dataset, sha256_file)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     folder = pathlib.Path(tmp, "libsvm")
    ...     folder.mkdir()
    ...     _ = (folder / "toy").write_text("+1 1:0.5\\n-1 2:1.5\\n")
    ...     entry = LibsvmDataset("toy", "binary/toy", n_samples=2, n_features=2,
    ...                           labels="pm1", sha256=sha256_file(folder / "toy"))
    ...     register_dataset(entry, overwrite=True)
    ...     fetch_libsvm("toy", cache_dir=tmp, download=False).name
    'toy'
    >>> register_dataset(entry)
    Traceback (most recent call last):
    ...
    ValueError: data set 'toy' is already registered (pass overwrite=True)
    """
    if not isinstance(entry, LibsvmDataset):
        raise TypeError(f"entry must be a LibsvmDataset, got {type(entry).__name__}")
    if entry.name in _REGISTRY and not overwrite:
        raise ValueError(f"data set {entry.name!r} is already registered (pass overwrite=True)")
    _REGISTRY[entry.name] = entry
