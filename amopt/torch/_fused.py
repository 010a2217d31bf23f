"""Fused CPU kernels for ``AMSGD(fused=True)`` and ``AMAdamW(fused=True)``: load, dispatch, drive.

A fused step is the three stages of every AM method (``docs/algorithms.md``):

1. **reduce** (C, ``csrc/am_fused.c``): one pass over ``g, d, x`` (and ``v``) that
   writes the few sums of each tensor the beta rule needs;
2. **rule** (:mod:`amopt.core.rule`, torch ops on a small CPU tensor): beta of each scope
   from the stacked sums; the kernels contain no beta math;
3. **apply** (C): one pass that updates ``d`` and ``x`` given beta (or gamma).

With per-layer scopes the tensors are processed in chunks whose bytes fit in the
last-level cache (reduce the chunk, rule once on its sums, apply the chunk), so that
the apply pass reads each tensor while it is still cached; with a global scope all
tensors are reduced, the rule runs once, and the apply pass takes the tensors from
the last to the first for the same reason.

Where the kernels come from, in order:

* a library ``amopt.torch._am_fused`` placed next to this module (the wheel is pure
  Python and ships none; a packager may build one from ``csrc/``), loaded from the
  package directory when neither the file nor that directory is writable by another
  user;
* otherwise (the usual case) a build with the system C compiler at first use into a
  private cache directory,
  ``$AMOPT_KERNEL_CACHE`` or ``$XDG_CACHE_HOME/amopt/kernels`` (default
  ``~/.cache/amopt/kernels``): created with mode 0700, and refused when (links
  resolved) it is owned by another user, is writable by group or others, or sits below
  a directory others can write in. Each library is recorded with its SHA-256 next to
  it; one whose hash does not match, or that does not load, is rebuilt. When the cache
  is refused, the kernels are built in a fresh private temporary directory
  (``tempfile.mkdtemp``) for this process only.

Every library carries the SHA-256 of the sources it was built from and an ABI
number; one built from other sources (a stale install) is not used.

Each library holds the kernels three times (x86-64 baseline, AVX2+FMA, AVX-512);
the best one the CPU supports is picked at load time. ``AMOPT_CPU_FEATURES`` lowers
the choice (``avx2`` or ``baseline``), e.g. to reproduce an AVX2-only machine. The
kernels use OpenMP with ``torch.get_num_threads()`` threads; torch ships its own
``libgomp`` and the kernels share its thread pool.

Nothing here is required: when no library can be had, ``AMOPT_FUSED=0`` is set, or a
param group has tensors the kernels do not handle, the callers fall back to the
foreach implementation (same iterates up to float rounding) and say so once with a
:class:`FusedFallbackWarning`.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import importlib.machinery
import os
import platform
import shlex
import shutil
import stat
import subprocess
import sysconfig
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from amopt.core import rule as _rule
from amopt.core import tape as _tape
from amopt.torch import _eager
from amopt.torch._records import (
    NO_SCALER,
    AdamHyper,
    AdamTensors,
    FusedFallbackWarning,
    Scaler,
    SGDHyper,
    SGDTensors,
    as_real,
)

__all__ = [
    "FusedFallbackWarning",
    "UnsafeKernelPath",
    "adam_traffic",
    "eagerly",
    "fallback_grads",
    "fused_am_adamw",
    "fused_amsgd",
    "fused_status",
    "installed_library",
    "library",
    "private_directory",
    "source_hash",
    "warn_fallback",
]

ABI_VERSION = 6
CSRC = Path(__file__).resolve().parent / "csrc"
#: The kernel sources, hashed in this order.
SOURCES = ("am_fused.c", "am_fused_common.h", "am_fused_kernels.h", "am_fused_variant.h")
#: Name of a library placed next to this module (none is built at install time).
EXTENSION = "_am_fused"
ISAS = ("base", "avx2", "avx512")
_CPU_FEATURE_LEVELS = {"baseline": 0, "base": 0, "avx2": 1, "avx512": 2}
_MODES = {"decoupled": 0, "proximal": 1, "l2": 0}
_DTYPES = (torch.float32, torch.float64)
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}
_BASE_FLAGS = ("-O3", "-fno-math-errno", "-ffp-contract=off", "-std=c99", "-fPIC", "-shared")
# tried in order until one compiles: OpenMP threads, then SIMD pragmas only, then plain C
_FLAG_SETS = (("-fopenmp",), ("-fopenmp-simd",), ())
_DEFAULT_CHUNK_BYTES = 4 << 20

_lock = threading.Lock()
_state: dict[str, Any] = {"tried": False, "lib": None, "error": None, "path": None}
_warned: set[str] = set()


class UnsafeKernelPath(RuntimeError):
    """A kernel library or directory another user could have written: never loaded."""


# --------------------------------------------------------------------------- trusted paths


def _uid() -> int | None:
    getuid = getattr(os, "getuid", None)
    return getuid() if getuid is not None else None


def _check_private(path: Path, st: os.stat_result, what: str, *, root_ok: bool = False) -> None:
    """``path`` (``st`` from ``lstat``) must be ours (or root's) and writable by nobody else."""
    uid = _uid()
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeKernelPath(f"{what} {path} is a symbolic link")
    owners = (uid, 0) if root_ok else (uid,)
    if uid is not None and st.st_uid not in owners:
        raise UnsafeKernelPath(
            f"{what} {path} is owned by uid {st.st_uid}, not by this user (uid {uid})"
        )
    if st.st_mode & 0o022:
        raise UnsafeKernelPath(
            f"{what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
        )


def _check_ancestors(path: Path) -> None:
    """No directory above ``path`` lets another user replace it.

    Each must be owned by this user or root, and not writable by others unless it has
    the sticky bit (as ``/tmp``), which stops them renaming or removing our entries.
    """
    uid = _uid()
    for parent in path.parents:
        st = os.stat(parent)
        if uid is not None and st.st_uid not in (uid, 0):
            raise UnsafeKernelPath(
                f"directory {parent} above {path} is owned by uid {st.st_uid}, "
                f"neither this user (uid {uid}) nor root"
            )
        if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
            raise UnsafeKernelPath(
                f"directory {parent} above {path} is writable by everyone (no sticky bit)"
            )


def private_directory(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` with mode 0700 if missing; check that only this user can write in it.

    Parameters
    ----------
    path : path-like
        The directory (missing parents are created with the default mode).

    Returns
    -------
    Path
        The directory, symbolic links resolved.

    Raises
    ------
    UnsafeKernelPath
        It is not a directory, is owned by another user, is writable by group or
        others, or sits below a directory another user can write in.
    OSError
        It cannot be created.
    """
    path = Path(os.path.abspath(path))
    if not os.path.lexists(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    real = Path(os.path.realpath(path))
    st = os.lstat(real)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeKernelPath(f"kernel cache {real} is not a directory")
    _check_private(real, st, "kernel cache directory")
    _check_ancestors(real)
    return real


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_library_file(path: Path, *, root_ok: bool = False) -> None:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeKernelPath(f"kernel library {path} is not a regular file")
    _check_private(path, st, "kernel library", root_ok=root_ok)


# --------------------------------------------------------------------------- build


def source_hash() -> str:
    """SHA-256 of the kernel sources (``csrc/``); a library built from others is refused."""
    data = b"\0".join((CSRC / name).read_bytes() for name in SOURCES)
    return hashlib.sha256(data).hexdigest()


def _compiler() -> list[str]:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    cmd = shlex.split(cc)
    if not cmd or shutil.which(cmd[0]) is None:
        for name in ("cc", "gcc", "clang"):
            if shutil.which(name):
                return [name]
        return []
    return cmd


def _compiler_version(cc: list[str]) -> str:
    try:
        out = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0] if out.stdout else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def library_name(cc: list[str]) -> str:
    """File name of the run-time build: a hash of the sources, the compiler and the flags.

    No ``-march=native``: the library holds every ISA variant and picks one at load
    time, so the name does not depend on the CPU.
    """
    key = hashlib.sha256(
        "\0".join(
            [
                source_hash(),
                " ".join(cc),
                _compiler_version(cc),
                repr((_BASE_FLAGS, _FLAG_SETS, ABI_VERSION)),
                platform.system(),
                platform.machine(),
            ]
        ).encode()
    ).hexdigest()[:20]
    suffix = sysconfig.get_config_var("SHLIB_SUFFIX") or ".so"
    return f"amopt_fused_{key}{suffix}"


def compile_library(cc: list[str], out: Path) -> list[str]:
    """Compile the kernels into ``out``, trying the flag sets in order; returns the command.

    Raises
    ------
    RuntimeError
        No flag set compiles (the message holds each compiler error).
    """
    errors = []
    define = f'-DAM_SOURCE_HASH="{source_hash()}"'
    for extra in _FLAG_SETS:
        cmd = [*cc, *_BASE_FLAGS, *extra, define, str(CSRC / SOURCES[0]), "-o", str(out), "-lm"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as exc:
            errors.append(f"{' '.join(cmd)}: {exc}")
            continue
        if proc.returncode == 0 and out.exists():
            return cmd
        errors.append(f"{' '.join(cmd)}: {proc.stderr.strip()[-500:]}")
    raise RuntimeError("could not compile the fused kernels:\n" + "\n".join(errors))


def _build_into(cc: list[str], directory: Path, name: str) -> Path:
    """Build ``directory/name`` and record its SHA-256 in ``directory/name.sha256``.

    Both files appear atomically (written under a temporary name in the same private
    directory, then renamed), the library with mode 0700 and its record with 0600.
    """
    target = directory / name
    with tempfile.TemporaryDirectory(prefix="amopt-build-") as tmp:
        built = Path(tmp) / name
        compile_library(cc, built)
        digest = _sha256_file(built)
        staged = directory / f".{name}.{os.getpid()}.tmp"
        shutil.copyfile(built, staged)
        os.chmod(staged, 0o700)
        os.replace(staged, target)
    record = directory / f".{name}.sha256.{os.getpid()}.tmp"
    record.write_text(digest + "\n", encoding="ascii")
    os.chmod(record, 0o600)
    os.replace(record, directory / f"{name}.sha256")
    return target


def _verified(path: Path) -> bool:
    """The library and its record exist, are ours and private, and the SHA-256 matches."""
    record = path.with_name(path.name + ".sha256")
    if not os.path.lexists(path) or not os.path.lexists(record):
        return False
    _check_library_file(path)
    _check_library_file(record)
    return record.read_text(encoding="ascii").strip() == _sha256_file(path)


def _open(path: Path) -> ctypes.CDLL:
    """Load a kernel library that matches this ABI and these sources."""
    lib = ctypes.CDLL(str(path))
    lib.am_abi_version.restype = ctypes.c_int
    version = lib.am_abi_version()
    if version != ABI_VERSION:
        raise RuntimeError(f"{path} has kernel ABI {version}, expected {ABI_VERSION}")
    lib.am_source_hash.restype = ctypes.c_char_p
    if lib.am_source_hash().decode() != source_hash():
        raise RuntimeError(f"{path} was built from other kernel sources than these")
    return lib


def _load_cached(cc: list[str], directory: Path) -> tuple[ctypes.CDLL, Path]:
    """The verified library of these sources in the private ``directory``, built if needed.

    A library whose SHA-256 does not match its record, or that does not load, is rebuilt.
    """
    target = directory / library_name(cc)
    if _verified(target):
        try:
            return _open(target), target
        except (OSError, RuntimeError):
            pass
    _build_into(cc, directory, target.name)
    if not _verified(target):
        raise UnsafeKernelPath(f"kernel library {target} changed after it was built")
    return _open(target), target


def cache_directory() -> Path:
    """``$AMOPT_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/amopt/kernels`` (``~/.cache``)."""
    env = os.environ.get("AMOPT_KERNEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "amopt" / "kernels"


def installed_library() -> Path | None:
    """The library ``pip install`` built next to this module, if there is one."""
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"{EXTENSION}{suffix}"
        if os.path.lexists(candidate):
            return candidate
    return None


def _open_installed(path: Path) -> ctypes.CDLL:
    _check_library_file(path, root_ok=True)
    st = os.lstat(path.parent)
    _check_private(path.parent, st, "package directory", root_ok=True)
    return _open(path)


def _find_library(notes: list[str]) -> tuple[ctypes.CDLL, Path, str]:
    """The kernel library: installed, else cached (private directory), else temporary."""
    installed = installed_library()
    if installed is not None:
        try:
            return _open_installed(installed), installed, "installed"
        except (OSError, RuntimeError) as exc:
            notes.append(f"installed library not used ({exc})")
    cc = _compiler()
    if not cc:
        raise RuntimeError(
            "no C compiler found (set CC, or install cc/gcc/clang), and no library "
            "built at install time" + "".join(f"; {note}" for note in notes)
        )
    try:
        directory = private_directory(cache_directory())
        lib, path = _load_cached(cc, directory)
        return lib, path, "cache"
    except (OSError, UnsafeKernelPath) as exc:
        notes.append(f"kernel cache not used ({exc})")
    tmp = Path(tempfile.mkdtemp(prefix="amopt-kernels-"))  # mode 0700, unpredictable name
    atexit.register(shutil.rmtree, tmp, True)
    lib, path = _load_cached(cc, private_directory(tmp))
    return lib, path, "temporary"


class _Kernels:
    """The loaded library, with the functions of the selected ISA variant bound."""

    def __init__(self, lib: ctypes.CDLL, path: Path, origin: str) -> None:
        self.lib, self.path, self.origin = lib, path, origin
        lib.am_cpu_level.restype = ctypes.c_int
        lib.am_isa_built.restype = ctypes.c_int
        lib.am_openmp.restype = ctypes.c_int
        self.cpu_level = int(lib.am_cpu_level())
        built = int(lib.am_isa_built())
        level = min(self.cpu_level, _requested_level())
        while level > 0 and not built & (1 << level):
            level -= 1
        self.isa = ISAS[level]
        self.openmp = bool(lib.am_openmp())
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        self.fn: dict[str, Any] = {}
        signatures = {
            "sgd_reduce": [i64, vp, vp, vp, vp, vp, vp, i64, vp],
            "sgd_apply": [i64, vp, vp, vp, vp, vp, vp, i64, vp, i64],
            "adam_reduce": [i64, vp, vp, vp, vp, vp, vp, i64, vp, vp, i64, vp],
            "adam_apply": [i64, vp, vp, vp, vp, vp, vp, i64, vp, vp, i64, vp, i64, i64],
            "sgd_step": [i64, vp, vp, vp, vp, vp, vp, i64, vp, i64, i64, vp, i64, vp, vp, vp, vp,
                         vp, i64],
            "adam_step": [i64, vp, vp, vp, vp, vp, vp, i64, vp, vp, i64, i64, vp, i64, i64, vp,
                          i64, vp, vp, vp, vp, i64],
            "adam_traffic": [i64, vp, vp, vp, vp, vp, i64, vp, i64, vp, i64, vp],
        }  # fmt: skip
        for kernel, argtypes in signatures.items():
            for suffix in ("f32", "f64"):
                fn = getattr(lib, f"am_{kernel}_{suffix}_{self.isa}")
                fn.argtypes = argtypes
                fn.restype = ctypes.c_int
                self.fn[f"{kernel}_{suffix}"] = fn
        self.advance_steps = lib.am_advance_steps
        self.advance_steps.argtypes = [i64, vp, vp, ctypes.c_double, vp]
        self.advance_steps.restype = ctypes.c_int
        self.tape_eval = lib.am_tape_eval
        self.tape_eval.argtypes = [vp, i64, vp, i64, i64, vp, i64, vp]
        self.tape_eval.restype = ctypes.c_int


def _requested_level() -> int:
    """The highest ISA variant allowed by ``AMOPT_CPU_FEATURES`` (default: any)."""
    value = os.environ.get("AMOPT_CPU_FEATURES", "").strip().lower()
    if not value:
        return len(ISAS) - 1
    if value not in _CPU_FEATURE_LEVELS:
        raise ValueError(
            f"AMOPT_CPU_FEATURES must be one of {', '.join(_CPU_FEATURE_LEVELS)}; "
            f"got AMOPT_CPU_FEATURES={value!r}"
        )
    return _CPU_FEATURE_LEVELS[value]


def library() -> _Kernels | None:
    """The loaded kernels, finding or building them on first use; ``None`` when unavailable.

    The reason for ``None`` is in ``fused_status()["error"]``.
    """
    if _state["tried"]:
        return _state["lib"]
    with _lock:
        if _state["tried"]:
            return _state["lib"]
        notes: list[str] = []
        try:
            if os.environ.get("AMOPT_FUSED", "1").strip().lower() in ("0", "false", "no", "off"):
                raise RuntimeError("disabled by AMOPT_FUSED=0")
            lib, path, origin = _find_library(notes)
            _state.update(lib=_Kernels(lib, path, origin), path=str(path))
        except Exception as exc:  # noqa: BLE001 - any failure means "use the fallback"
            _state["error"] = f"{type(exc).__name__}: {exc}"
        _state["notes"] = notes
        _state["tried"] = True
    return _state["lib"]


def missing() -> str:
    """Why the fused CPU kernels cannot be loaded (``""`` when they can): the one check of
    their availability, which every caller asks.

    Loading takes a lock and may compile; ``torch.compile`` calls this eagerly and keeps
    its result as a constant of the graph (``amopt.torch._eager.fused_cpu_missing``).
    """
    if library() is None:
        return f"the fused CPU kernels are unavailable ({_state.get('error')})"
    return ""


def fused_status() -> dict[str, object]:
    """Whether the fused kernels are available, which ones, and why not if not.

    Returns
    -------
    dict
        ``available`` (bool), ``path`` (the shared library), ``origin``
        (``"installed"``: built by ``pip install``; ``"cache"``: built on first use in
        the kernel cache; ``"temporary"``: built in a private temporary directory for
        this process), ``isa`` (the variant in use: ``"base"``, ``"avx2"`` or
        ``"avx512"``), ``openmp`` (bool), ``notes`` (why an earlier place was not
        used) and ``error`` (why the kernels are unavailable, or ``None``).

    Examples
    --------
    >>> from amopt.torch._fused import fused_status
    >>> sorted(fused_status())
    ['available', 'error', 'isa', 'notes', 'openmp', 'origin', 'path']
    """
    lib = library()
    return {
        "available": lib is not None,
        "path": _state.get("path"),
        "origin": lib.origin if lib is not None else None,
        "isa": lib.isa if lib is not None else None,
        "openmp": lib.openmp if lib is not None else False,
        "notes": list(_state.get("notes", [])),
        "error": _state.get("error"),
    }


def warn_fallback(reason: str) -> None:
    """Warn once per distinct reason that ``fused=True`` ran the foreach implementation."""
    if reason in _warned:
        return
    _warned.add(reason)
    warnings.warn(
        f"fused=True: {reason}; using the foreach implementation instead "
        "(same iterates up to float rounding)",
        FusedFallbackWarning,
        stacklevel=4,
    )


# --------------------------------------------------------------------------- eligibility

_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__
_plain_types: dict[type, bool] = {}
_PLAIN_TYPES = frozenset((Tensor, torch.nn.Parameter))
_STEP_DTYPES = frozenset((torch.float32, torch.float64))


def _is_plain(t: Tensor) -> bool:
    """A tensor whose memory is its own (not a DTensor, FakeTensor or other wrapper)."""
    kind = type(t)
    plain = _plain_types.get(kind)
    if plain is None:
        plain = getattr(kind, "__torch_dispatch__", None) is _PLAIN_DISPATCH
        _plain_types[kind] = plain
    return plain


def _check(
    arrays: Sequence[Sequence[Tensor | None]],
) -> str | tuple[list[list[Tensor | None]], torch.dtype, list[int], list[list[int]]]:
    """The arrays seen as real tensors, their dtype, sizes and addresses; or why not eligible.

    ``arrays[k][i]`` is the k-th array (parameters, gradients, states) of tensor ``i``;
    ``None`` entries (a momentum buffer still to create) are skipped and get address 0.
    """
    fast = _check_common(arrays)
    return fast if fast is not None else _check_each(arrays)


def _check_common(
    arrays: Sequence[Sequence[Tensor | None]],
) -> tuple[list[list[Tensor | None]], torch.dtype, list[int], list[list[int]]] | None:
    """:func:`_check` for the usual group (plain real CPU tensors, contiguous, one dtype).

    ``None`` when any tensor is otherwise; :func:`_check_each` then finds out why. Runs
    every step, so it reads as few tensor attributes as it can.
    """
    dtype = arrays[0][0].dtype
    if dtype not in _DTYPES:
        return None
    plain = _PLAIN_TYPES
    try:
        numels = [t.numel() for t in arrays[0]]
        addresses = []
        for array in arrays:
            tensors, sizes = array, numels
            if any(t is None for t in array):
                tensors = [t for t in array if t is not None]
                sizes = [k for t, k in zip(array, numels, strict=True) if t is not None]
            if not (
                all(
                    type(t) in plain and t.dtype is dtype and t.is_cpu and t.is_contiguous()
                    for t in tensors
                )
                and [t.numel() for t in tensors] == sizes
            ):
                return None
            addresses.append([0 if t is None else t.data_ptr() for t in array])
    except (RuntimeError, ValueError):  # e.g. is_contiguous() of a sparse tensor
        return None
    if _aliased(addresses):
        return None
    return arrays, dtype, numels, addresses  # type: ignore[return-value]


def _check_each(
    arrays: Sequence[Sequence[Tensor | None]],
) -> str | tuple[list[list[Tensor | None]], torch.dtype, list[int], list[list[int]]]:
    """:func:`_check` tensor by tensor, naming the first reason the kernels cannot run."""
    if arrays[0][0].is_complex():
        arrays = [[None if t is None else as_real(t) for t in a] for a in arrays]
    dtype = arrays[0][0].dtype
    if dtype not in _DTYPES:
        return f"dtype {dtype} is not float32/float64"
    numels = [t.numel() for t in arrays[0]]
    addresses = []
    for array in arrays:
        ptrs = []
        for t, numel in zip(array, numels, strict=True):
            if t is None:
                ptrs.append(0)
                continue
            if not _is_plain(t):
                return (
                    f"{type(t).__name__} parameters or states have no plain local storage "
                    "the fused kernels can address (the kernels take plain tensors)"
                )
            if not t.is_cpu:
                return f"a tensor is on {t.device}; the fused kernels run on the CPU"
            if t.dtype != dtype:
                return (
                    f"a param group mixes {dtype} and {t.dtype}; the fused kernels need one "
                    "dtype (float32 or float64) per group"
                )
            if t.layout != torch.strided or not t.is_contiguous():
                return "the fused kernels need dense, contiguous tensors"
            if t.numel() != numel:
                return "a gradient or state has another size than its parameter"
            ptrs.append(t.data_ptr())
        addresses.append(ptrs)
    if _aliased(addresses):
        return "a parameter shares memory with its gradient, its state or another parameter"
    return arrays, dtype, numels, addresses  # type: ignore[return-value]


def _aliased(addresses: list[list[int]]) -> bool:
    """Whether two of the tensors (0: a buffer still to create) start at one address."""
    used = [p for ptrs in addresses for p in ptrs if p]
    return len(set(used)) != len(used)


def _run(step: Any, *args: Any) -> Any:
    return step(*args)


_eager.register("fused_run", "disable", _run)


def eagerly(step: Any, *args: Any) -> Any:
    """``step(*args)`` (:func:`fused_amsgd` or :func:`fused_am_adamw`) run eagerly where
    ``torch.compile`` traces a step that cannot take the custom operators of
    :mod:`amopt.torch._fused_ops`: dynamo cannot trace the kernels' ctypes call (a graph
    break at this call). Disabled on first traced use (:mod:`amopt.torch._eager`), so
    that ``import amopt.torch`` does not load the compiler."""
    if torch.compiler.is_compiling():
        return _eager.fused_run(step, *args)
    return step(*args)


class _Steps:
    """The step counters of a group as the kernels take them: addresses and dtype flags."""

    __slots__ = ("n", "ptrs", "doubles")

    def __init__(self, steps: Sequence[Tensor]) -> None:
        self.n = len(steps)
        self.ptrs = (ctypes.c_void_p * self.n)(*[s.data_ptr() for s in steps])
        self.doubles = bytes(s.dtype is torch.float64 for s in steps)

    def advance(self, kernels: Any, beta2: float = 0.0, ib2: np.ndarray | None = None) -> None:
        """``steps += 1`` in place; with ``ib2``, also ``ib2 = 1 / (1 - beta2^steps)``."""
        out = None if ib2 is None else ib2.ctypes.data
        kernels.advance_steps(self.n, self.ptrs, self.doubles, beta2, out)


def _check_steps(steps: Sequence[Tensor]) -> str | _Steps:
    """The counters as :class:`_Steps`, or why the kernels cannot advance them."""
    for s in steps:
        if not (
            type(s) in _PLAIN_TYPES and s.is_cpu and s.dtype in _STEP_DTYPES and s.numel() == 1
        ):
            return "the step counters are not float32/float64 CPU scalars"
    return _Steps(steps)


def _stack(tensors: Sequence[Tensor], dtype: torch.dtype) -> Tensor:
    """1-element tensors stacked into one CPU vector of ``dtype``."""
    try:
        out = torch.stack(list(tensors))
    except RuntimeError:  # mixed dtypes, devices or shapes
        out = torch.stack([t.to("cpu", dtype).reshape(()) for t in tensors])
    return out.to("cpu", dtype).reshape(len(tensors))


def _threads() -> int:
    return max(1, torch.get_num_threads())


def _chunk_bytes() -> int:
    """Bytes of the tensors one per-layer chunk may hold (``$AMOPT_FUSED_CHUNK_BYTES``)."""
    env = os.environ.get("AMOPT_FUSED_CHUNK_BYTES")
    return max(1, int(env)) if env else _cache_budget()


@functools.cache
def _cache_budget() -> int:
    """A quarter of the last-level cache (Linux sysfs), within [1 MiB, 8 MiB].

    Measured on a 32 MiB L3: chunks of a quarter of it leave the apply pass most of its
    data in cache and keep the interpreter's own working set warm for the rule between
    the passes; half the cache was slower by about 10 % of a step.
    """
    try:
        sizes = []
        for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
            if (index / "type").read_text().strip() == "Instruction":
                continue
            text = (index / "size").read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KM")) * scale)
        if sizes:
            return min(max(max(sizes) // 4, 1 << 20), 8 << 20)
    except (OSError, ValueError):
        pass
    return _DEFAULT_CHUNK_BYTES


def _chunks(sizes: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive ``[a, b)`` ranges whose bytes fit in ``budget`` (at least one tensor each)."""
    out, a, total = [], 0, 0
    for b, size in enumerate(sizes):
        if b > a and total + size > budget:
            out.append((a, b))
            a, total = b, 0
        total += size
    out.append((a, len(sizes)))
    return out


def _grad_multiplier(grad_scale: Tensor | None, maximize: bool) -> float:
    sign = -1.0 if maximize else 1.0
    if grad_scale is None:
        return sign
    return sign / float(grad_scale)


def _skip(found_inf: Tensor | None) -> bool:
    return found_inf is not None and float(found_inf) != 0.0


def fallback_grads(
    grads: list[Tensor], grad_scale: Tensor | None, found_inf: Tensor | None
) -> list[Tensor] | None:
    """The gradients the foreach fallback steps on: ``grads / grad_scale`` (new tensors).

    ``None`` when ``found_inf`` is set (the step is skipped); ``grads`` themselves when
    there is no scale.
    """
    if _skip(found_inf):
        return None
    if grad_scale is None:
        return grads
    return [g / grad_scale.to(g.device) for g in grads]


def _coef(t: Any, dtype: torch.dtype, shape: tuple[int, ...]) -> Tensor:
    """A rule output as a contiguous CPU tensor of ``dtype`` and ``shape`` for the kernels."""
    if not (
        isinstance(t, Tensor)
        and t.dtype == dtype
        and t.shape == shape
        and t.is_cpu
        and t.is_contiguous()
    ):
        t = torch.broadcast_to(torch.as_tensor(t, dtype=dtype, device="cpu"), shape).contiguous()
    return t


class _Arrays:
    """ctypes views of a group: sizes and the addresses of each array's tensors.

    ``at(k)`` gives the addresses of entry ``k`` of the size array and of each
    pointer array, so that a kernel call covers the tensors ``k, k+1, ...``.
    """

    __slots__ = ("keep", "base")

    def __init__(self, numels: Sequence[int], addresses: Sequence[Sequence[int]]) -> None:
        n = len(numels)
        self.keep = [(ctypes.c_int64 * n)(*numels)]
        self.keep += [(ctypes.c_void_p * n)(*ptrs) for ptrs in addresses]
        self.base = [ctypes.addressof(a) for a in self.keep]

    def at(self, k: int) -> list[int]:
        return [b + 8 * k for b in self.base]


def _scopes(numels: Sequence[int], per_layer: bool, bytes_per_element: int, sync: Any) -> list:
    """``(a, b)`` tensor ranges, each run as reduce, rule, apply.

    One range for a global scope, and when the sums are added across ranks (one
    collective per step, for all scopes); per-layer chunks that fit the cache otherwise.
    """
    if not per_layer or _collective(sync):
        return [(0, len(numels))]
    return _chunks([bytes_per_element * k for k in numels], _chunk_bytes())


def _chunk_array(ranges: list[tuple[int, int]]) -> np.ndarray:
    return np.ascontiguousarray(np.array(ranges, dtype=np.int64).reshape(-1))


def _collective(sync: Any) -> bool:
    return sync is not None and bool(sync.needs_collective)


def _rows(sums: Tensor, a: int, b: int, dtype: torch.dtype, per_layer: bool, sync: Any) -> Tensor:
    """The rule's input: the sums of tensors ``a..b-1`` (per layer) or of all, in ``dtype``.

    With a ``sync`` plan (``amopt.torch._distributed``) the sums of sharded scopes are
    added across ranks here, at the seam between reduce and rule.
    """
    rows = sums[a:b].to(dtype) if per_layer else sums.sum(0).to(dtype)
    if _collective(sync):
        rows = sync.combine([rows], [list(range(a, b))] if per_layer else None)[0]
    return rows


class _Scopes:
    """The per-scope sums of a fused step and the rule's outputs, as NumPy arrays.

    The kernels write the float64 sums of each tensor into ``sums``; ``array`` is a
    NumPy view of them. Normally the rule runs inside the kernels as a tape
    (:meth:`tape`); otherwise (a rule that cannot be recorded, or sharded scopes whose
    sums are added across ranks first, through torch) the passes are driven from here
    and :meth:`rule` runs it on NumPy between them.
    """

    __slots__ = ("sums", "array", "np_dtype", "per_layer", "sync")

    def __init__(self, n: int, dtype: torch.dtype, per_layer: bool, sync: Any) -> None:
        self.sums = torch.empty((n, 3), dtype=torch.float64)
        self.array = self.sums.numpy()
        self.np_dtype = _NUMPY[dtype]
        self.per_layer, self.sync = per_layer, sync

    def rule(self, rule: Any, a: int, b: int, **kwargs: Any) -> Any:
        """``rule(xp, rows, ...)`` of tensors ``a..b-1``, as contiguous arrays of the dtype.

        The rule runs on the float64 sums: a float32 scope's sums leave float32's range
        long before its gradients do (``|g|`` below about 1e-19 or above 1e19), and beta,
        a ratio of them, does not. Its outputs are rounded to the parameters' dtype.
        """
        if _collective(self.sync):
            rows = _rows(self.sums, a, b, torch.float64, self.per_layer, self.sync).numpy()
        elif self.per_layer:
            rows = self.array[a:b]
        else:
            rows = self.array.sum(0)
        with np.errstate(all="ignore"):  # 0/0 and inf/inf are handled by the rule
            out = rule(np, rows, **kwargs)
        # new C-ordered arrays of the rule's shape (ascontiguousarray would make a 0-d one 1-d)
        if isinstance(out, tuple):
            return tuple(np.array(o, dtype=self.np_dtype) for o in out)
        return np.array(out, dtype=self.np_dtype)

    def at(self, a: int) -> int:
        return self.sums.data_ptr() + 24 * a

    def tape(self, rule: Any, **kwargs: Any) -> tuple | None:
        """The rule as a tape for the kernels' whole-step functions, or ``None``.

        The rule takes four inputs per scope: its three sums and one value the kernels
        are handed (the learning-rate ratio, AM-Adam's first-step flag). ``None`` (the
        passes are driven from here, the rule run by NumPy between them) when the
        scopes' sums are added across ranks first, or when the rule in
        :mod:`amopt.core.rule` cannot be recorded (:func:`amopt.core.tape.trace`).
        """
        if _collective(self.sync):
            return None
        return _tape.traced(rule, 4, **kwargs)

    def outputs(self, n: int, k: int) -> list[np.ndarray]:
        """``k`` arrays the whole-step kernels write the rule's outputs into."""
        return [np.empty(n if self.per_layer else (), dtype=self.np_dtype) for _ in range(k)]

    def value(self, parts: list[np.ndarray]) -> Tensor:
        """The outputs of every scope as one tensor: per tensor (1-D), or the global 0-d one."""
        if self.per_layer:
            return torch.from_numpy(np.concatenate(parts))
        return torch.from_numpy(parts[0].reshape(()))

    def tensors(self, value: Tensor, n: int) -> list[Tensor]:
        """One 0-d tensor per parameter: its scope's value (the same one for a global scope)."""
        return list(value.unbind()) if self.per_layer else [value] * n


# --------------------------------------------------------------------------- AMSGD


def fused_amsgd(
    t: SGDTensors, h: SGDHyper, amp: Scaler = NO_SCALER, sync: Any = None
) -> list[Tensor] | str | None:
    """One AMSGD step with the fused kernels (in place), as ``_single_tensor_amsgd``.

    Parameters
    ----------
    t : SGDTensors
        ``params, grads, momentum_buffer_list, state_steps`` as in
        :func:`amopt.torch.amsgd`; a ``None`` momentum buffer is created (step 0,
        ``d = g``).
    h : SGDHyper
        ``lr, weight_decay, maximize`` as in :class:`amopt.torch.AMSGD` (coupled weight
        decay ``g + wd x``) and the rule's ``config`` (``lam``, ``beta_max``,
        ``per_layer``, the variant).
    amp : Scaler, optional
        ``grad_scale``: the gradients are ``grad_scale`` times the true ones
        (``torch.amp.GradScaler``) and the kernels use ``g / grad_scale``;
        ``found_inf`` nonzero: skip the step, leaving parameters and state untouched.
    sync : ScopeSync, optional
        The plan of :func:`amopt.torch._distributed.localize` when the tensors are
        local pieces of sharded scopes: their sums are added across ranks (one
        collective for the step) between the reduce and the rule.

    Returns
    -------
    list of Tensor, str or None
        The 0-d beta of each parameter (the same tensor for all when the scope is
        global), in the parameters' dtype; a string saying why the kernels cannot run
        this group (nothing was modified then); ``None`` when ``found_inf`` skipped the
        step.
    """
    params, grads, momentum_buffer_list, state_steps = t
    lr, weight_decay, maximize, config, lr_ratio = h
    grad_scale, found_inf = amp
    n = len(params)
    if _skip(found_inf):
        return None
    if n == 0:
        return []
    reason = missing()
    if reason:
        return reason
    kernels = library()
    checked = _check([params, grads, momentum_buffer_list])
    if isinstance(checked, str):
        return checked
    (xs, _, bufs), dtype, numels, addresses = checked
    steps = _check_steps(state_steps)
    if isinstance(steps, str):
        return steps

    # step 0 (docs/algorithms.md, section 2): d = g, written by the kernels from the g they
    # form, also over a buffer made before the step (AMSGD makes d = g + wd x in torch,
    # whose rounding of g + wd x the kernels' need not share: v = d - g would not be 0)
    first = (ctypes.c_uint8 * n)(
        *[b is None or not s.item() for b, s in zip(bufs, state_steps, strict=True)]
    )
    for k, b in enumerate(bufs):
        if b is None:  # step 0: the kernels write d = g into the new buffer
            buf = torch.empty_like(grads[k], memory_format=torch.contiguous_format)
            momentum_buffer_list[k] = buf
            addresses[2][k] = as_real(buf).data_ptr()
    steps.advance(kernels)

    suffix = _SUFFIX[dtype]
    reduce_fn, apply_fn = kernels.fn[f"sgd_reduce_{suffix}"], kernels.fn[f"sgd_apply_{suffix}"]
    hp = (ctypes.c_double * 3)(_grad_multiplier(grad_scale, maximize), weight_decay, lr)
    arrays = _Arrays(numels, addresses)
    per_layer = config.per_layer
    scopes = _Scopes(n, dtype, per_layer, sync)
    first_at, nt = ctypes.addressof(first), _threads()
    ranges = _scopes(numels, per_layer, 3 * xs[0].element_size(), sync)
    # the rule's fourth input (_tape.input_rule): r = lr_{t-1} / lr_t
    ratio = np.array([float(lr_ratio)])
    tape = scopes.tape(_tape.input_rule, base=_rule.momentum_beta, name="lr_ratio", cfg=config)
    if tape is not None:  # reduce -> rule -> apply per chunk, all in the kernels
        code, outs = tape
        chunks = _chunk_array(ranges)
        beta, gamma = scopes.outputs(n, 2)
        status = kernels.fn[f"sgd_step_{suffix}"](
            n, *arrays.at(0), first_at, hp, nt, chunks.ctypes.data, len(ranges),
            int(per_layer), code.ctypes.data, len(code), outs.ctypes.data, scopes.at(0),
            beta.ctypes.data, gamma.ctypes.data, ratio.ctypes.data, 0,
        )  # fmt: skip
        if status != 0:
            raise RuntimeError("the fused kernels refused the rule's tape")
        torch.autograd.graph.increment_version([*params, *momentum_buffer_list, *state_steps])
        return scopes.tensors(scopes.value([beta]), n)
    parts = []
    for a, b in ranges:
        numel, x, g, d = arrays.at(a)
        reduce_fn(b - a, numel, x, g, d, first_at + a, hp, nt, scopes.at(a))
        beta, gamma = scopes.rule(_rule.momentum_beta, a, b, cfg=config, lr_ratio=ratio[0])
        stride = int(gamma.ndim > 0)
        apply_fn(b - a, numel, x, g, d, first_at + a, gamma.ctypes.data, stride, hp, nt)
        parts.append(beta)
    torch.autograd.graph.increment_version([*params, *momentum_buffer_list, *state_steps])
    return scopes.tensors(scopes.value(parts), n)


# --------------------------------------------------------------------------- AM-AdamW


def fused_am_adamw(
    t: AdamTensors, h: AdamHyper, amp: Scaler = NO_SCALER, sync: Any = None
) -> tuple[list[Tensor], list[Tensor]] | str | None:
    """One AM-AdamW / AM-Adam step with the fused kernels (in place), as the reference.

    Parameters
    ----------
    t : AdamTensors
        ``params, grads, exp_avgs, exp_avg_sqs, state_steps, beta1_prods`` as in
        :func:`amopt.torch.am_adamw`.
    h : AdamHyper
        ``lr, beta2, eps, weight_decay, maximize`` as in :class:`amopt.torch.AMAdamW`;
        ``weight_decay_mode`` (``"l2"``, AM-Adam, adds ``weight_decay * x`` to the
        gradient and the rule sees no decay) and the rule's ``config`` (``beta_max`` is
        the cap of beta1).
    amp, sync
        As in :func:`fused_amsgd`.

    Returns
    -------
    (betas, beta1_prods), str or None
        Per parameter the 0-d beta applied and the updated product of its scope; a
        string saying why the kernels cannot run this group (nothing was modified
        then); ``None`` when ``found_inf`` skipped the step.
    """
    params, grads, exp_avgs, exp_avg_sqs, state_steps, beta1_prods = t
    lr, beta2, eps, weight_decay, weight_decay_mode, maximize, config, lr_ratio = h
    grad_scale, found_inf = amp
    n = len(params)
    if _skip(found_inf):
        return None
    if n == 0:
        return [], []
    if weight_decay_mode not in _MODES:
        raise ValueError(
            f"weight_decay_mode must be one of {tuple(_MODES)}; "
            f"got weight_decay_mode={weight_decay_mode!r}"
        )
    reason = missing()
    if reason:
        return reason
    kernels = library()
    checked = _check([params, grads, exp_avgs, exp_avg_sqs])
    if isinstance(checked, str):
        return checked
    (xs, *_), dtype, numels, addresses = checked
    steps = _check_steps(state_steps)
    if isinstance(steps, str):
        return steps

    ib2 = np.empty(n)
    steps.advance(kernels, beta2, ib2)  # and ib2 = 1 / (1 - beta2^step)
    l2 = weight_decay_mode == "l2"
    wd = 0.0 if l2 else weight_decay
    hp = (ctypes.c_double * 13)(
        _grad_multiplier(grad_scale, maximize),
        weight_decay if l2 else 0.0,
        beta2,
        eps,
        config.lam,
        lr,
        1.0 - lr * wd if weight_decay_mode == "decoupled" else 1.0,
        1.0 / (1.0 + lr * wd) if weight_decay_mode == "proximal" else 1.0,
        *_rule.adam_weights(config, lr=lr, weight_decay=wd, lr_ratio=float(lr_ratio)),
    )
    mode = _MODES[weight_decay_mode]
    suffix = _SUFFIX[dtype]
    reduce_fn, apply_fn = kernels.fn[f"adam_reduce_{suffix}"], kernels.fn[f"adam_apply_{suffix}"]
    arrays = _Arrays(numels, addresses)
    per_layer = config.per_layer
    scopes = _Scopes(n, dtype, per_layer, sync)
    ib2_at, nt = ib2.ctypes.data, _threads()
    itemsize = xs[0].element_size()
    if per_layer:  # one bias correction per tensor (scope)
        prods = _stack(beta1_prods, dtype)
    else:
        prods = beta1_prods[0].to("cpu", dtype).reshape(())
    c = _coef(_rule.adam_correction(prods, config), dtype, tuple(prods.shape))
    stride = int(per_layer)
    # the rule's fourth input: 1 on a scope's first step, whose product is still 1
    firsts = (prods == 1.0).to(torch.float64).numpy()
    ranges = _scopes(numels, per_layer, 4 * itemsize, sync)
    tape = scopes.tape(
        _tape.input_rule, base=_rule.adam_beta, name="first", cfg=config, lr=lr, weight_decay=wd
    )
    if tape is not None:  # reduce -> rule -> apply per chunk, all in the kernels
        code, outs = tape
        chunks = _chunk_array(ranges)
        (beta,) = scopes.outputs(n, 1)
        status = kernels.fn[f"adam_step_{suffix}"](
            n, *arrays.at(0), c.data_ptr(), stride, ib2_at, hp, mode, nt, chunks.ctypes.data,
            len(ranges), int(per_layer), code.ctypes.data, len(code), outs.ctypes.data,
            scopes.at(0), beta.ctypes.data, firsts.ctypes.data, stride,
        )  # fmt: skip
        if status != 0:
            raise RuntimeError("the fused kernels refused the rule's tape")
        parts = [beta]
    else:
        # every argument prepared first: between the passes only the rule runs
        heads = [
            (b - a, *arrays.at(a), c.data_ptr() + itemsize * a * stride, stride, ib2_at + 8 * a)
            for a, b in ranges
        ]
        parts = []
        for head, (a, b) in zip(heads, ranges, strict=True):
            reduce_fn(*head, hp, nt, scopes.at(a))
            first = firsts[a:b] if per_layer else firsts
            beta = scopes.rule(
                _rule.adam_beta, a, b, cfg=config, lr=lr, weight_decay=wd, first=first
            )
            apply_fn(*head, beta.ctypes.data, stride, hp, mode, nt)
            parts.append(beta)
    torch.autograd.graph.increment_version([*params, *exp_avgs, *exp_avg_sqs, *state_steps])
    value = scopes.value(parts)
    return scopes.tensors(value, n), scopes.tensors(prods * value, n)


def adam_traffic(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    *,
    per_layer: bool = True,
    has_x: bool = True,
) -> float:
    """The memory traffic of one fused AM-Adam step, without its arithmetic.

    The two passes of :func:`fused_am_adamw` over the same tensors, in the same order
    and chunks, reading and writing what the kernels read and write (the parameters too
    with ``has_x``: the numerator's weight-decay sums read them), but writing back the
    values read: no tensor changes. Its time is a floor for any two-pass step over these
    tensors on this machine; ``python -m amopt.bench --extra`` compares it with
    ``AdamW(fused=True)``.

    Returns
    -------
    float
        The sum of the values the first pass read (kept so that no load is dropped).
    """
    reason = missing()
    if reason:
        raise RuntimeError(reason)
    kernels = library()
    checked = _check([list(params), list(grads), list(exp_avgs), list(exp_avg_sqs)])
    if isinstance(checked, str):
        raise ValueError(f"adam_traffic: {checked}")
    (xs, *_), dtype, numels, addresses = checked
    arrays = _Arrays(numels, addresses)
    ranges = _scopes(numels, per_layer, 4 * xs[0].element_size(), None)
    chunks = _chunk_array(ranges)
    sums = np.empty(len(ranges))
    one_zero = np.array([1.0, 0.0])
    kernels.fn[f"adam_traffic_{_SUFFIX[dtype]}"](
        len(numels), *arrays.at(0), int(has_x), one_zero.ctypes.data, _threads(),
        chunks.ctypes.data, len(ranges), sums.ctypes.data,
    )  # fmt: skip
    return float(sums.sum())
