"""Cache directory, download and checksum verification of data files."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from ._registry import dataset_info

__all__ = [
    "ChecksumError",
    "DownloadError",
    "fetch_libsvm",
    "get_data_home",
    "sha256_file",
]

_ENV_VAR = "AMOPT_DATA_DIR"


class DownloadError(OSError):
    """A data file could not be downloaded (offline, unreachable URL, HTTP error)."""


class ChecksumError(OSError):
    """A downloaded or cached file does not have the registered SHA-256."""


def get_data_home(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The directory amopt stores downloaded data and cached reference solutions in.

    Resolution order: the ``cache_dir`` argument, the ``AMOPT_DATA_DIR``
    environment variable, then ``~/.cache/amopt``. LIBSVM files live in the
    ``libsvm/`` subdirectory. The directory is not created here.

    Parameters
    ----------
    cache_dir : path-like, optional
        Explicit directory; wins over the environment variable.

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> from amopt.datasets import get_data_home
    >>> str(get_data_home("/tmp/amopt-data"))
    '/tmp/amopt-data'
    """
    if cache_dir is not None:
        if not isinstance(cache_dir, str | os.PathLike):
            raise TypeError(f"cache_dir must be a path or None, got {type(cache_dir).__name__}")
        return Path(cache_dir).expanduser()
    env = os.environ.get(_ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "amopt"


def sha256_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of the bytes of ``path`` (read in chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(chunk_size), b""):
            h.update(chunk)
    return h.hexdigest()


def _manual_hint(url: str, dest: Path) -> str:
    return (
        f"download it by hand from {url} and place it at {dest} (or set the {_ENV_VAR} "
        f"environment variable / pass cache_dir= to a directory whose libsvm/ subdirectory "
        f"holds {dest.name})"
    )


def _download(url: str, dest: Path, sha256: str | None, timeout: float) -> Path:
    """Stream ``url`` into ``dest`` atomically, verifying ``sha256`` if given."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    h = hashlib.sha256()
    try:
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
                while chunk := resp.read(1 << 20):
                    h.update(chunk)
                    out.write(chunk)
        except urllib.error.HTTPError as exc:
            raise DownloadError(
                f"could not download {url}: the server answered HTTP {exc.code} ({exc.reason}). "
                f"To use this data set anyway, {_manual_hint(url, dest)}"
            ) from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise DownloadError(
                f"could not download {url} ({reason}); you may be offline. To use this data "
                f"set without network access, {_manual_hint(url, dest)}"
            ) from exc
        digest = h.hexdigest()
        if sha256 is not None and digest != sha256.lower():
            raise ChecksumError(
                f"the file downloaded from {url} has sha256 {digest}, expected {sha256}; the "
                f"corrupted download was deleted. Retry, or {_manual_hint(url, dest)}"
            )
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dest


def fetch_libsvm(
    name: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    base_url: str | None = None,
    download: bool = True,
    verify: bool = True,
    timeout: float = 60.0,
) -> Path:
    """Path of the registered LIBSVM file ``name``, downloading it once if needed.

    The file is looked up as ``<data home>/libsvm/<file name>`` (see
    :func:`get_data_home`). If it is absent it is downloaded from the LIBSVM
    site (or ``base_url``, a mirror with the same layout), written atomically,
    and its SHA-256 checked against the registry.

    Parameters
    ----------
    name : str
        A registry name, see :func:`list_datasets`.
    cache_dir : path-like, optional
        Data home; default ``$AMOPT_DATA_DIR`` or ``~/.cache/amopt``.
    base_url : str, optional
        Mirror root replacing :data:`LIBSVM_URL`.
    download : bool, default True
        If false, a missing file raises :class:`FileNotFoundError` instead.
    verify : bool, default True
        Check the SHA-256 (of downloads, and of files already in the cache).
    timeout : float, default 60
        Socket timeout in seconds.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    DownloadError
        Network failure; the message names the URL and where to put the file by hand.
    ChecksumError
        The downloaded (deleted) or cached (kept, since it may be user data) file
        has the wrong SHA-256.
    """
    info = dataset_info(name)
    if not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    dest = get_data_home(cache_dir) / "libsvm" / info.file_name
    url = info.url(base_url)
    expected = info.sha256 if verify else None
    if dest.exists():
        if expected is not None:
            digest = sha256_file(dest)
            if digest != expected:
                raise ChecksumError(
                    f"cached file {dest} has sha256 {digest}, expected {expected} for {name!r}; "
                    f"delete it to download it again from {url}, or pass verify=False"
                )
        return dest
    if not download:
        raise FileNotFoundError(
            f"{dest} does not exist and download=False; {_manual_hint(url, dest)}"
        )
    return _download(url, dest, expected, float(timeout))
