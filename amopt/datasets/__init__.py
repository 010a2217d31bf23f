"""LIBSVM data: a loader, a registry of the standard sets, a download cache.

``load_libsvm("mushrooms")`` and ``load_libsvm("a1a")`` work offline (compressed
copies ship in ``amopt/datasets/data/``); other registered names are downloaded
once from the LIBSVM site into ``$AMOPT_DATA_DIR/libsvm`` (default: the
``libsvm/`` folder of the cache home, :func:`get_cache_home`:
``$AMOPT_CACHE_DIR``, else the platform's user cache directory,
``~/.cache/amopt`` on Linux) and verified by SHA-256 (the registry's, or one
recorded at the first download), also on every later use; where no SHA-256 is
known, the file must hold the registry's number of samples. Files that belong
together (a train/test pair) are read with one set of decisions by
``load_libsvm_files``. Parsing uses scikit-learn (``pip install amopt[data]``).

What amopt computes (reference solutions of :mod:`amopt.problems`) is cached in
the cache home, never in the data folder: a folder named by ``AMOPT_DATA_DIR``
may be shared and read-only. See ``docs/caching.md``.
"""

from ._download import (
    ChecksumError,
    DownloadError,
    fetch_libsvm,
    get_cache_home,
    get_data_home,
    sha256_file,
)
from ._libsvm import (
    LABEL_CONVENTIONS,
    binary_labels,
    class_indices,
    load_libsvm,
    load_libsvm_files,
)
from ._registry import LIBSVM_URL, LibsvmDataset, dataset_info, list_datasets, register_dataset

__all__ = [
    "LABEL_CONVENTIONS",
    "LIBSVM_URL",
    "ChecksumError",
    "DownloadError",
    "LibsvmDataset",
    "binary_labels",
    "class_indices",
    "dataset_info",
    "fetch_libsvm",
    "get_cache_home",
    "get_data_home",
    "list_datasets",
    "load_libsvm",
    "load_libsvm_files",
    "register_dataset",
    "sha256_file",
]
