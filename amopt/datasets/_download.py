"""Data and cache directories, download and checksum verification of data files.

Two directories, never confused:

* the *data home* (:func:`get_data_home`): where LIBSVM files are looked up and
  downloaded to, ``cache_dir=``, else ``$AMOPT_DATA_DIR``, else the cache home. A
  folder named by ``AMOPT_DATA_DIR`` may be shared and read-only: amopt only reads
  it, and writes there only a download that was asked for (a missing file) and its
  ``.sha256`` record;
* the *cache home* (:func:`get_cache_home`): what amopt computes and may recompute,
  ``$AMOPT_CACHE_DIR``, else the platform's user cache directory
  (``$XDG_CACHE_HOME/amopt`` or ``~/.cache/amopt`` on Linux,
  ``~/Library/Caches/amopt`` on macOS, ``%LOCALAPPDATA%\\amopt\\Cache`` on Windows):
  reference solutions (``reference/``) and the SHA-256 recorded for a LIBSVM file
  placed by hand in a data folder (``checksums/``).
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import http.client
import os
import platform
import tempfile
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._registry import dataset_info

__all__ = [
    "ChecksumError",
    "DownloadError",
    "fetch_libsvm",
    "get_cache_home",
    "get_data_home",
    "sha256_file",
]

_ENV_VAR = "AMOPT_DATA_DIR"
_CACHE_ENV_VAR = "AMOPT_CACHE_DIR"


class DownloadError(OSError):
    """A data file could not be downloaded (offline, unreachable URL, HTTP error).

    Examples
    --------
    A mirror (here an empty local folder, as a ``file:`` URL) without the file:

    >>> import pathlib, tempfile
    >>> from amopt.datasets import (
    ...     DownloadError, LibsvmDataset, fetch_libsvm, register_dataset)
    >>> entry = LibsvmDataset("toy-missing", "binary/toy-missing", n_samples=2,
    ...                       n_features=2, labels="pm1")
    >>> register_dataset(entry, overwrite=True)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     mirror = pathlib.Path(tmp, "mirror").as_uri()
    ...     try:
    ...         fetch_libsvm("toy-missing", cache_dir=tmp, base_url=mirror)
    ...     except DownloadError as err:
    ...         print(str(err).startswith("could not download file:"), isinstance(err, OSError))
    True True
    """


class ChecksumError(OSError):
    """A downloaded or cached file is not the registered one: its SHA-256 differs from the
    registered (or recorded) one, or, where none is known, it does not hold the registry's
    number of samples.

    Examples
    --------
    A file in the data folder whose SHA-256 is not the registered one:

    >>> import pathlib, tempfile
    >>> from amopt.datasets import (
    ...     ChecksumError, LibsvmDataset, fetch_libsvm, register_dataset)
    >>> entry = LibsvmDataset("toy-corrupt", "binary/toy-corrupt", n_samples=2,
    ...                       n_features=2, labels="pm1", sha256="0" * 64)
    >>> register_dataset(entry, overwrite=True)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     folder = pathlib.Path(tmp, "libsvm")
    ...     folder.mkdir()
    ...     _ = (folder / "toy-corrupt").write_text("+1 1:0.5\\n-1 2:1.5\\n")
    ...     try:
    ...         fetch_libsvm("toy-corrupt", cache_dir=tmp, download=False)
    ...     except ChecksumError as err:
    ...         print("has sha256" in str(err), isinstance(err, OSError))
    True True
    """


def _check_dir_arg(name: str, value: Any) -> Path:
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"{name} must be a path or None, got {type(value).__name__}")
    if not os.fspath(value):
        raise ValueError(f"{name} must be a non-empty path or None, got ''")
    return Path(value).expanduser()


def user_cache_dir(system: str | None = None, environ: Any = None) -> Path:
    """The platform's per-user cache directory for amopt (``AMOPT_CACHE_DIR`` ignored).

    Linux and other Unix systems: ``$XDG_CACHE_HOME/amopt``, else
    ``~/.cache/amopt``; macOS: ``~/Library/Caches/amopt``; Windows:
    ``%LOCALAPPDATA%\\amopt\\Cache`` (else ``~\\AppData\\Local\\amopt\\Cache``), the
    directories ``platformdirs.user_cache_dir("amopt", appauthor=False)`` gives.
    ``system`` (a :func:`platform.system` name) and ``environ`` default to this machine's.
    """
    system = platform.system() if system is None else system
    env = os.environ if environ is None else environ
    if system == "Windows":
        base = env.get("LOCALAPPDATA") or os.path.join(os.path.expanduser("~"), "AppData", "Local")
        return Path(base) / "amopt" / "Cache"
    if system == "Darwin":
        return Path(os.path.expanduser("~")) / "Library" / "Caches" / "amopt"
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative value is ignored
        return Path(xdg) / "amopt"
    return Path(os.path.expanduser("~")) / ".cache" / "amopt"


def get_cache_home(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The directory amopt keeps what it computes in (reference solutions, recorded checksums).

    Resolution order: the ``cache_dir`` argument, the ``AMOPT_CACHE_DIR``
    environment variable, then the platform's user cache directory
    (``$XDG_CACHE_HOME/amopt`` or ``~/.cache/amopt`` on Linux,
    ``~/Library/Caches/amopt`` on macOS, ``%LOCALAPPDATA%\\amopt\\Cache`` on
    Windows). Never a data folder: ``AMOPT_DATA_DIR`` plays no part. The
    directory is not created here. Everything in it may be deleted at any time;
    it is recomputed when needed.

    Parameters
    ----------
    cache_dir : path-like, optional
        Explicit directory; wins over ``AMOPT_CACHE_DIR``.

    Returns
    -------
    pathlib.Path
        The cache home, not created here.

    Examples
    --------
    >>> from amopt.datasets import get_cache_home
    >>> str(get_cache_home("/tmp/amopt-cache"))
    '/tmp/amopt-cache'
    """
    return _home(cache_dir, _CACHE_ENV_VAR, user_cache_dir)


def get_data_home(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The directory amopt looks for LIBSVM files in and downloads them to.

    Resolution order: the ``cache_dir`` argument, the ``AMOPT_DATA_DIR``
    environment variable, then the cache home (:func:`get_cache_home`:
    ``$AMOPT_CACHE_DIR``, else the platform's user cache directory, e.g.
    ``~/.cache/amopt`` on Linux). LIBSVM files live in the ``libsvm/``
    subdirectory. The directory is not created here. Reference solutions are
    not kept here but in :func:`get_cache_home`, so a data folder may be
    read-only.

    Parameters
    ----------
    cache_dir : path-like, optional
        Explicit directory; wins over ``AMOPT_DATA_DIR`` and the cache home.

    Returns
    -------
    pathlib.Path
        The data home (LIBSVM files in its ``libsvm/`` subdirectory), not created here.

    Examples
    --------
    >>> from amopt.datasets import get_data_home
    >>> (get_data_home("/tmp/amopt-data") / "libsvm").as_posix()  # where LIBSVM files go
    '/tmp/amopt-data/libsvm'
    """
    return _home(cache_dir, _ENV_VAR, get_cache_home)


def _home(cache_dir: Any, env_var: str, default: Callable[[], Path]) -> Path:
    """The argument ``cache_dir``, else the environment variable ``env_var``, else
    ``default()``: the resolution order of both homes."""
    if cache_dir is not None:
        return _check_dir_arg("cache_dir", cache_dir)
    env = os.environ.get(env_var)
    if env:
        return Path(env).expanduser()
    return default()


def sha256_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of the bytes of ``path`` (read in chunks).

    Parameters
    ----------
    path : path-like
        The file.
    chunk_size : int, default 1 MiB
        Bytes read at a time.

    Returns
    -------
    str
        64 lowercase hexadecimal digits.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from amopt.datasets import sha256_file
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = pathlib.Path(tmp, "file")
    ...     _ = path.write_bytes(b"abc")
    ...     sha256_file(path)
    'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad'
    """
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(chunk_size), b""):
            h.update(chunk)
    return h.hexdigest()


def count_samples(path: str | os.PathLike[str]) -> int:
    """The number of samples (non-blank, non-comment lines) of a LIBSVM file.

    ``.bz2`` and ``.gz`` files (recognised by their first bytes) are read decompressed.
    A file that cannot be decompressed to its end (cut short) raises ``OSError`` or
    ``EOFError``.
    """
    with open(path, "rb") as raw:
        magic = raw.read(3)
    opener: Any = open
    if magic == b"BZh":
        opener = bz2.open
    elif magic[:2] == b"\x1f\x8b":
        opener = gzip.open
    n = 0
    with opener(path, "rb") as fh:
        for line in fh:
            if line.split(b"#", 1)[0].strip():
                n += 1
    return n


def _rows_problem(path: Path, name: str, expected_rows: int) -> str | None:
    """Why ``path`` is not the registered file ``name`` by its number of samples, or None."""
    try:
        rows = count_samples(path)
    except (OSError, EOFError, ValueError) as exc:  # a compressed file cut short
        return f"{path} cannot be read to its end ({exc}): it is truncated or corrupted"
    if rows != expected_rows:
        return (
            f"{path} holds {rows} samples, but the registry says {name!r} has "
            f"{expected_rows}: it is truncated or corrupted"
        )
    return None


def _manual_hint(url: str, dest: Path) -> str:
    return (
        f"download it by hand from {url} and place it at {dest} (or set the {_ENV_VAR} "
        f"environment variable / pass cache_dir= to a directory whose libsvm/ subdirectory "
        f"holds {dest.name})"
    )


def _unwritable(directory: Path, exc: OSError, cache_dir: Any = None) -> OSError:
    """The error for a data directory that cannot be written, naming where it was chosen."""
    reason = exc.strerror or str(exc)
    env = os.environ.get(_ENV_VAR)
    if cache_dir is not None:
        source = (
            f"it was chosen by cache_dir={os.fspath(cache_dir)!r}; pass a writable cache_dir, "
            f"or omit it and set the {_ENV_VAR} environment variable"
        )
    elif env:
        source = (
            f"it was chosen by the {_ENV_VAR} environment variable ({_ENV_VAR}={env!r}); "
            f"point {_ENV_VAR} at a writable directory"
        )
    else:
        source = (
            f"it is the default, as the {_ENV_VAR} environment variable is not set; set "
            f"{_ENV_VAR} to a writable directory"
        )
    err = OSError(
        exc.errno,
        f"cannot write to the amopt data directory {directory} ({reason}): {source} (or place "
        "the files it needs there by hand)",
    )
    err.filename = str(directory)
    return err


def _sidecar(dest: Path) -> Path:
    """Where the SHA-256 of a download without a registered checksum is recorded."""
    return dest.with_name(dest.name + ".sha256")


def _cache_record(dest: Path) -> Path:
    """Where the SHA-256 of a file placed by hand in a data folder is recorded: the cache
    home's ``checksums/`` (one entry per absolute path), never the data folder."""
    where = hashlib.sha256(os.fsencode(os.path.abspath(dest))).hexdigest()[:16]
    return get_cache_home() / "checksums" / f"{where}-{dest.name}.sha256"


def _read_digest(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    digest = text.split()[0].lower() if text.split() else ""
    if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
        return digest
    return None


def _read_sidecar(dest: Path) -> str | None:
    """The SHA-256 recorded for ``dest`` at its download, or None if none is readable."""
    return _recorded(dest)[0]


def _recorded(dest: Path) -> tuple[str | None, Path]:
    """The SHA-256 recorded for ``dest`` and where: beside it (a download), else in the
    cache home (a file placed by hand in a data folder); ``(None, beside)`` if neither."""
    for path in (_sidecar(dest), _cache_record(dest)):
        digest = _read_digest(path)
        if digest is not None:
            return digest, path
    return None, _sidecar(dest)


def _write_atomic(dest: Path, data: bytes) -> None:
    fd, tmp_name = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp_name, dest)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)


def _stream(url: str, dest: Path, out, timeout: float) -> str:
    """Copy the body of ``url`` into the open file ``out``; return its SHA-256.

    Network failures raise :class:`DownloadError`; errors writing ``out`` propagate.
    """
    h = hashlib.sha256()
    try:
        resp = urllib.request.urlopen(url, timeout=timeout)
    except urllib.error.HTTPError as exc:
        raise DownloadError(
            f"could not download {url}: the server answered HTTP {exc.code} "
            f"({exc.reason}). To use this data set anyway, {_manual_hint(url, dest)}"
        ) from exc
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise _offline(url, dest, exc) from exc
    with resp:
        expected_size = resp.headers.get("Content-Length", "")
        received = 0
        while True:
            try:
                chunk = resp.read(1 << 20)
            except (http.client.HTTPException, OSError, ValueError) as exc:
                raise _offline(url, dest, exc) from exc
            if not chunk:
                break
            received += len(chunk)
            h.update(chunk)
            out.write(chunk)
    # http.client ends a body cut short by a dropped connection as if it were complete
    if expected_size.isdigit() and received != int(expected_size):
        raise DownloadError(
            f"the download of {url} was cut short: received {received} of {expected_size} "
            f"bytes; the partial file was deleted. Retry, or {_manual_hint(url, dest)}"
        )
    return h.hexdigest()


def _download(url: str, dest: Path, sha256: str | None, timeout: float) -> Path:
    """Stream ``url`` into ``dest`` atomically, verifying ``sha256`` if given; return ``dest``."""
    _download_digest(url, dest, sha256, timeout)
    return dest


def _download_digest(
    url: str,
    dest: Path,
    sha256: str | None,
    timeout: float,
    expected_from: str = "registered",
    cache_dir: Any = None,
) -> str:
    """Stream ``url`` into ``dest`` atomically, verifying ``sha256`` if given; return its hash.

    The data directory is created if needed; an error writing there names the
    directory and the ``AMOPT_DATA_DIR`` variable rather than the network.
    """
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
    except OSError as exc:
        raise _unwritable(dest.parent, exc, cache_dir) from exc
    tmp = Path(tmp_name)
    try:
        try:
            with os.fdopen(fd, "wb") as out:
                digest = _stream(url, dest, out, timeout)
        except DownloadError:
            raise
        except OSError as exc:  # writing the file: a full disk, a quota
            raise _unwritable(dest.parent, exc, cache_dir) from exc
        if sha256 is not None and digest != sha256.lower():
            raise ChecksumError(
                f"the file downloaded from {url} has sha256 {digest}, expected {sha256} "
                f"({expected_from}); the corrupted download was deleted. Retry, or "
                f"{_manual_hint(url, dest)}"
            )
        try:
            os.replace(tmp, dest)
        except OSError as exc:
            raise _unwritable(dest.parent, exc, cache_dir) from exc
    finally:
        if tmp.exists():
            tmp.unlink()
    return digest


def _offline(url: str, dest: Path, exc: BaseException) -> DownloadError:
    reason = getattr(exc, "reason", None) or exc
    return DownloadError(
        f"could not download {url} ({reason}); you may be offline. To use this data "
        f"set without network access, {_manual_hint(url, dest)}"
    )


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
    site (or ``base_url``, a mirror with the same layout) and written
    atomically. Its SHA-256 is checked against the registry; where the
    registry has none, the SHA-256 of the download is recorded next to it in
    ``<file name>.sha256`` and checked on later calls.

    A cached file whose SHA-256 does not match (a truncated copy, a flipped
    bit) is never loaded: with ``download=True`` a fresh copy is downloaded
    and verified, the bad file is kept as ``<file name>.corrupt`` and a
    warning names both hashes; otherwise :class:`ChecksumError` is raised.
    Where no SHA-256 is known (a data set without a registered checksum whose
    file was placed by hand, or downloaded without ``verify``), the file must
    hold the registry's number of samples (``n_samples``), else it is treated
    as a corrupted one; a file that does is then recorded as a download is. A
    download with no checksum to check is counted the same way before its
    SHA-256 is recorded.

    Parameters
    ----------
    name : str
        A registry name, see :func:`list_datasets`.
    cache_dir : path-like, optional
        Data home; default ``$AMOPT_DATA_DIR`` or ``~/.cache/amopt``.
    base_url : str, optional
        Mirror root replacing :data:`LIBSVM_URL`.
    download : bool, default True
        If false, a missing file raises :class:`FileNotFoundError` instead,
        and a corrupted one :class:`ChecksumError`.
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
        Network failure or a download cut short; the message names the URL
        and where to put the file by hand.
    ChecksumError
        A download (deleted) has the wrong SHA-256, or a cached file does and
        no verified copy could be downloaded; the message names the file and
        both hashes.
    OSError
        The data directory cannot be written; the message names it and the
        ``AMOPT_DATA_DIR`` variable.

    Examples
    --------
    >>> from amopt.datasets import fetch_libsvm
    >>> fetch_libsvm("a9a", cache_dir="/nonexistent", download=False)
    Traceback (most recent call last):
    ...
    FileNotFoundError: /nonexistent/libsvm/a9a does not exist and download=False; ...
    """
    info = dataset_info(name)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if base_url is not None and not isinstance(base_url, str):
        raise TypeError(f"base_url must be a str or None, got {type(base_url).__name__}")
    dest = get_data_home(cache_dir) / "libsvm" / info.file_name
    url = info.url(base_url)
    expected, expected_from = info.sha256, "registered"
    if expected is None:
        expected, record = _recorded(dest)
        expected_from = (
            f"recorded in {record} when it was first downloaded or checked; delete "
            "that file to accept a new version of the data"
        )
    if dest.exists():
        if not verify:
            return dest
        if expected is None:
            # no checksum was ever recorded (a file placed by hand): what the registry
            # knows of the file, its number of samples, must hold; then its hash is recorded
            problem = _rows_problem(dest, name, info.n_samples)
            if problem is None:
                # in a data folder (AMOPT_DATA_DIR, maybe shared and read-only) the hash
                # goes to the cache home; in amopt's own download cache, beside the file
                data_folder = cache_dir is None and bool(os.environ.get(_ENV_VAR))
                _record(dest, sha256_file(dest), _cache_record(dest) if data_folder else None)
                return dest
            problem = f"cached file {problem} (no SHA-256 was recorded for it)"
        else:
            digest = sha256_file(dest)
            if digest == expected:
                return dest
            problem = (
                f"cached file {dest} has sha256 {digest}, expected {expected} ({expected_from}) "
                f"for {name!r}: it is truncated or corrupted"
            )
        if not download:
            raise ChecksumError(
                f"{problem}; delete it (or pass download=True) to download it again from "
                f"{url}, or pass verify=False to use it anyway"
            )
        aside = dest.with_name(dest.name + ".corrupt")
        try:
            os.replace(dest, aside)
        except OSError as exc:
            raise _unwritable(dest.parent, exc, cache_dir) from exc
        try:
            digest = _download_digest(
                url, dest, expected, float(timeout), expected_from, cache_dir
            )
            if expected is None:
                _verify_rows(dest, name, info.n_samples, url, digest)
        except OSError as exc:
            os.replace(aside, dest)  # leave the cache as it was
            if isinstance(exc, DownloadError | ChecksumError):
                raise ChecksumError(f"{problem}, and downloading it again failed: {exc}") from exc
            raise
        if expected is None:
            _record(dest, digest)
        warnings.warn(
            f"{problem}; it was moved to {aside} and a verified copy downloaded from {url}",
            UserWarning,
            stacklevel=2,
        )
        return dest
    if not download:
        raise FileNotFoundError(
            f"{dest} does not exist and download=False; {_manual_hint(url, dest)}"
        )
    digest = _download_digest(
        url, dest, expected if verify else None, float(timeout), expected_from, cache_dir
    )
    if verify and expected is None:
        _verify_rows(dest, name, info.n_samples, url, digest)
    if info.sha256 is None:
        try:
            _write_atomic(_sidecar(dest), f"{digest}  {dest.name}\n".encode("ascii"))
        except OSError as exc:
            raise _unwritable(dest.parent, exc, cache_dir) from exc
    return dest


def _verify_rows(dest: Path, name: str, n_samples: int, url: str, digest: str) -> None:
    """A download with no checksum to check must hold the registry's number of samples;
    one that does not is deleted (before its hash could be recorded)."""
    problem = _rows_problem(dest, name, n_samples)
    if problem is not None:
        dest.unlink()
        raise ChecksumError(
            f"the file downloaded from {url} (sha256 {digest}) is not the registered one: "
            f"{problem}; the download was deleted. Retry, or {_manual_hint(url, dest)}"
        )


def _record(dest: Path, digest: str, where: Path | None = None) -> None:
    """Record ``digest`` for ``dest`` in ``where`` (default: beside it); a cache that cannot
    be written keeps none (the samples are then counted again at the next use)."""
    where = _sidecar(dest) if where is None else where
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(where, f"{digest}  {dest.name}\n".encode("ascii"))
    except OSError:
        pass
