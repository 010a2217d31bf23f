"""LIBSVM data: a loader, a registry of the standard sets, a download cache.

``load_libsvm("mushrooms")`` and ``load_libsvm("a1a")`` work offline (compressed
copies ship in ``amopt/datasets/data/``); other registered names are downloaded
once from the LIBSVM site into ``$AMOPT_DATA_DIR/libsvm`` (default
``~/.cache/amopt/libsvm``) and verified by SHA-256 (the registry's, or one
recorded at the first download), also on every later use; where no SHA-256 is
known, the file must hold the registry's number of samples. Files that belong
together (a train/test pair) are read with one set of decisions by
``load_libsvm_files``. Parsing uses scikit-learn (``pip install amopt[data]``).
"""

from ._download import ChecksumError, DownloadError, fetch_libsvm, get_data_home, sha256_file
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
    "get_data_home",
    "list_datasets",
    "load_libsvm",
    "load_libsvm_files",
    "register_dataset",
    "sha256_file",
]
