"""Registry of the standard LIBSVM data sets: where they live and what they contain."""

from __future__ import annotations

import dataclasses
from typing import Literal

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


def _b(name, path, n, d, labels, sha=None, **kw) -> LibsvmDataset:
    return LibsvmDataset(name, "binary/" + path, n, d, labels, 2, sha, **kw)


def _m(name, path, n, d, k, sha=None, **kw) -> LibsvmDataset:
    return LibsvmDataset(name, "multiclass/" + path, n, d, "multiclass", k, sha, **kw)


# sha256 values: computed on the copies in the project's offline data directory, which
# are the LIBSVM files as redistributed by konstmish/opt_methods, PanHaulin/CFNPM and
# baowj-678/Machine-Learning (see that directory's README). Entries whose only copy was
# re-compressed or re-encoded by a third party carry no checksum.
_ENTRIES = [
    _b("a1a", "a1a", 1605, 123, "pm1",
       "eb54c45f1bdb51286f803dd092eb8202b44637a858fc6c4e533a2d64a0d94b4e", bundled="a1a.bz2",
       note="Adult (UCI), subset 1; a bz2 copy ships with amopt"),
    _b("a1a.t", "a1a.t", 30956, 123, "pm1"),
    _b("a9a", "a9a", 32561, 123, "pm1",
       "f5d5ffd8d865ff41328e7ee043e4b020816914ff6843ff15b98905ddbedce906",
       note="Adult (UCI), full training set"),
    _b("a9a.t", "a9a.t", 16281, 123, "pm1",
       "1f448a153f0320399a7e40836eb207655b0bde0f21fc941cc472193daa9f5de9"),
    _b("w1a", "w1a", 2477, 300, "pm1"),
    _b("w8a", "w8a", 49749, 300, "pm1",
       "6a9fa8fd5f524303240a5db07d4b3d4a51e8b7b4b20a914105d8e3e8c81640f2"),
    _b("w8a.t", "w8a.t", 14951, 300, "pm1",
       "618929ecb01bebb841daec4cae4aa07b97832d29b08652452775598929547fde"),
    _b("mushrooms", "mushrooms", 8124, 112, "12",
       "f39a4eb628dc61a7d43760815b061c9e497aa728ce1ad8bde57a09ef6043b538",
       bundled="mushrooms.bz2", note="labels 1/2; a bz2 copy ships with amopt"),
    _b("ijcnn1", "ijcnn1.bz2", 49990, 22, "pm1", note="training + validation (35,000 + 14,990)"),
    _b("ijcnn1.t", "ijcnn1.t.bz2", 91701, 22, "pm1"),
    _b("madelon", "madelon", 2000, 500, "pm1"),
    _b("madelon.t", "madelon.t", 600, 500, "pm1",
       "ae60251b63a46c6ace348b77749e79e25d4098d629d1dead2852c3d4daf1f8ea"),
    _b("phishing", "phishing", 11055, 68, "01"),
    _b("covtype.binary", "covtype.libsvm.binary.bz2", 581012, 54, "12"),
    _b("covtype.binary.scale", "covtype.libsvm.binary.scale.bz2", 581012, 54, "12"),
    _b("rcv1.binary", "rcv1_train.binary.bz2", 20242, 47236, "pm1"),
    _b("real-sim", "real-sim.bz2", 72309, 20958, "pm1"),
    _b("news20.binary", "news20.binary.bz2", 19996, 1355191, "pm1"),
    _b("gisette", "gisette_scale.bz2", 6000, 5000, "pm1"),
    _b("gisette.t", "gisette_scale.t.bz2", 1000, 5000, "pm1"),
    _b("australian", "australian_scale", 690, 14, "pm1"),
    _b("breast-cancer", "breast-cancer_scale", 683, 10, "24"),
    _b("diabetes", "diabetes_scale", 768, 8, "pm1"),
    _b("german.numer", "german.numer_scale", 1000, 24, "pm1"),
    _b("heart", "heart_scale", 270, 13, "pm1"),
    _b("ionosphere", "ionosphere_scale", 351, 34, "pm1"),
    _b("sonar", "sonar_scale", 208, 60, "pm1"),
    _b("splice", "splice_scale", 1000, 60, "pm1"),
    _b("duke", "duke.bz2", 44, 7129, "pm1"),
    _b("leu", "leu.bz2", 38, 7129, "pm1"),
    _b("colon-cancer", "colon-cancer.bz2", 62, 2000, "pm1"),
    _m("dna", "dna.scale", 2000, 180, 3,
       "03d39477c5e48415e9cd18e006efc8f7a3b5c3deaee8289a72511c35070e3cfe"),
    _m("dna.t", "dna.scale.t", 1186, 180, 3,
       "d2eeed170e4e38ae2aba6aa4cd27a8ca4ecceb01a7751e8e509bb4e1a6bcef39"),
    _m("letter", "letter.scale", 15000, 16, 26,
       "ce2c7df15cc5742dc4382d59079181c97c21e0beaa0af53c84cc5745c69f1020"),
    _m("letter.t", "letter.scale.t", 5000, 16, 26,
       "07522ccbf54187fae6d560d1712b88c41ea1f7e8d19491c5adcc22ee37a075da"),
    _m("pendigits", "pendigits", 7494, 16, 10,
       "6e8a2f318a24d97d26a9c381642621dc955fed73ec44c4d417bd7afbb47ed67c"),
    _m("pendigits.t", "pendigits.t", 3498, 16, 10,
       "5ddb2f034e1c5ca8a47b8a7e78510f8a9d68015cf40a5031534c693fba9773d3"),
    _m("news20", "news20.bz2", 15935, 62061, 20,
       "8c79851f6f5fdc5540a0d04a5ab728353c42d26b84e73f93bda301c06c15ffe9"),
    _m("news20.t", "news20.t.bz2", 3993, 62061, 20),
    _m("usps", "usps.bz2", 7291, 256, 10),
    _m("usps.t", "usps.t.bz2", 2007, 256, 10),
    _m("mnist", "mnist.bz2", 60000, 780, 10),
    _m("mnist.t", "mnist.t.bz2", 10000, 780, 10),
]  # fmt: skip

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
    """
    if not isinstance(entry, LibsvmDataset):
        raise TypeError(f"entry must be a LibsvmDataset, got {type(entry).__name__}")
    if entry.name in _REGISTRY and not overwrite:
        raise ValueError(f"data set {entry.name!r} is already registered (pass overwrite=True)")
    _REGISTRY[entry.name] = entry
