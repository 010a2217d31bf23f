"""Fused CPU kernels for ``AMSGD(fused=True)`` and ``AMAdamW(fused=True)``: build, load, call.

The kernels (C, in :mod:`amopt.torch._fused_src`) are compiled with the
system C compiler the first time a fused step runs, and cached under
``$AMOPT_KERNEL_CACHE`` (default ``~/.cache/amopt/kernels``), keyed by the
source, the compiler, its flags and the CPU. They are loaded with
:mod:`ctypes` and work directly on the tensors' memory, with OpenMP threads
(``torch.get_num_threads()`` of them; when torch ships its own ``libgomp`` the
kernels share its thread pool).

Nothing here is required: when no compiler is found, compilation fails,
``AMOPT_FUSED=0`` is set, or a param group has tensors the kernels do not
handle (non-CPU, not float32/float64, non-contiguous, mixed dtypes), the
callers fall back to the foreach implementation, which gives the same iterates
up to float rounding, and say so once with a :class:`FusedFallbackWarning`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from amopt.torch._common import as_real
from amopt.torch._fused_src import source

__all__ = ["FusedFallbackWarning", "fused_status", "fused_am_adamw", "fused_amsgd", "library"]

_MODES = {"decoupled": 0, "proximal": 1, "l2": 2}
_VARIANTS = {None: 0, "clip": 1, "restart": 2}
_DTYPES = (torch.float32, torch.float64)
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_BASE_FLAGS = ("-O3", "-fno-math-errno", "-ffp-contract=fast", "-std=c99", "-fPIC", "-shared")
# tried in order until one compiles: OpenMP threads, then SIMD only, then plain C
_FLAG_SETS = (
    ("-march=native", "-mprefer-vector-width=512", "-fopenmp"),
    ("-march=native", "-fopenmp"),
    ("-march=native", "-fopenmp-simd"),
    ("-fopenmp",),
    (),
)

_lock = threading.Lock()
_state: dict[str, object] = {"tried": False, "lib": None, "error": None, "path": None}
_warned: set[str] = set()


class FusedFallbackWarning(UserWarning):
    """``fused=True`` could not use the fused kernels; the foreach implementation ran instead."""


# --------------------------------------------------------------------------- build and load


def _cache_dir() -> Path:
    env = os.environ.get("AMOPT_KERNEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "amopt" / "kernels"


def _compiler() -> list[str]:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    cmd = shlex.split(cc)
    if not cmd or shutil.which(cmd[0]) is None:
        for name in ("cc", "gcc", "clang"):
            if shutil.which(name):
                return [name]
        return []
    return cmd


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the CPU flags (Linux) or the processor name."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return line.strip()
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def _compiler_version(cc: list[str]) -> str:
    try:
        out = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0] if out.stdout else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def _build(cc: list[str], src: str, target: Path) -> None:
    """Compile ``src`` into ``target`` (atomically), trying the flag sets in order."""
    errors = []
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="amopt-build-") as tmp:
        c_file = Path(tmp) / "amopt_fused.c"
        c_file.write_text(src, encoding="utf-8")
        out = Path(tmp) / target.name
        for extra in _FLAG_SETS:
            cmd = [*cc, *_BASE_FLAGS, *extra, str(c_file), "-o", str(out), "-lm"]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            except (OSError, subprocess.SubprocessError) as exc:
                errors.append(f"{' '.join(cmd)}: {exc}")
                continue
            if proc.returncode == 0 and out.exists():
                staged = target.with_name(f"{target.name}.{os.getpid()}.tmp")
                shutil.copyfile(out, staged)
                os.replace(staged, target)
                return
            errors.append(f"{' '.join(cmd)}: {proc.stderr.strip()[-500:]}")
    raise RuntimeError("could not compile the fused kernels:\n" + "\n".join(errors))


def _declare(lib: ctypes.CDLL) -> None:
    p = ctypes.c_void_p
    i64p = ctypes.POINTER(ctypes.c_int64)
    dp = ctypes.POINTER(ctypes.c_double)
    for suffix in ("f32", "f64"):
        fn = getattr(lib, f"am_adamw_{suffix}")
        fn.argtypes = [ctypes.c_int64, i64p, p, p, p, p, p, p, p, p, dp, i64p]
        fn.restype = ctypes.c_int
        fn = getattr(lib, f"am_sgd_{suffix}")
        fn.argtypes = [ctypes.c_int64, i64p, p, p, p, p, p, dp, i64p]
        fn.restype = ctypes.c_int
    lib.am_openmp.argtypes = []
    lib.am_openmp.restype = ctypes.c_int


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, building it on first use; ``None`` when unavailable.

    The reason for ``None`` is in ``fused_status()["error"]``.
    """
    if _state["tried"]:
        return _state["lib"]  # type: ignore[return-value]
    with _lock:
        if _state["tried"]:
            return _state["lib"]  # type: ignore[return-value]
        try:
            if os.environ.get("AMOPT_FUSED", "1").strip().lower() in ("0", "false", "no", "off"):
                raise RuntimeError("disabled by AMOPT_FUSED=0")
            cc = _compiler()
            if not cc:
                raise RuntimeError("no C compiler found (set CC, or install cc/gcc/clang)")
            src = source()
            key = hashlib.sha256(
                "\0".join(
                    [
                        src,
                        " ".join(cc),
                        _compiler_version(cc),
                        repr((_BASE_FLAGS, _FLAG_SETS)),
                        _cpu_signature(),
                        platform.system(),
                    ]
                ).encode()
            ).hexdigest()[:20]
            suffix = sysconfig.get_config_var("SHLIB_SUFFIX") or ".so"
            name = f"amopt_fused_{key}{suffix}"
            target = _cache_dir() / name
            if not target.exists():
                try:
                    _build(cc, src, target)
                except OSError:  # an unwritable cache directory: a private temporary one
                    tmp = (
                        Path(tempfile.gettempdir())
                        / f"amopt-kernels-{getattr(os, 'getuid', lambda: 0)()}"
                    )
                    target = tmp / name
                    if not target.exists():
                        _build(cc, src, target)
            lib = ctypes.CDLL(str(target))
            _declare(lib)
            _state["lib"], _state["path"] = lib, str(target)
        except Exception as exc:  # noqa: BLE001 - any failure means "use the fallback"
            _state["error"] = f"{type(exc).__name__}: {exc}"
        _state["tried"] = True
    return _state["lib"]  # type: ignore[return-value]


def fused_status() -> dict[str, object]:
    """Whether the fused kernels are available, where they were built, and why not if not.

    Returns
    -------
    dict
        ``available`` (bool), ``path`` (the shared library), ``openmp`` (bool),
        ``error`` (the reason they are unavailable, or ``None``).

    Examples
    --------
    >>> from amopt.torch._fused import fused_status
    >>> sorted(fused_status())
    ['available', 'error', 'openmp', 'path']
    """
    lib = library()
    return {
        "available": lib is not None,
        "path": _state["path"],
        "openmp": bool(lib.am_openmp()) if lib is not None else False,
        "error": _state["error"],
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


def _ptrs(tensors: Sequence[Tensor]) -> ctypes.Array:
    return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])


def _dense(t: Tensor, dtype: torch.dtype, numel: int) -> bool:
    return (
        t.device.type == "cpu"
        and t.dtype == dtype
        and t.layout == torch.strided
        and t.is_contiguous()
        and t.numel() == numel
    )


def _check_arrays(arrays: Sequence[Sequence[Tensor]]) -> tuple[torch.dtype | None, str]:
    """The common dtype of the arrays, or ``None`` and the reason they are not eligible."""
    xs = arrays[0]
    dtype = xs[0].dtype
    if dtype not in _DTYPES:
        return None, f"dtype {dtype} is not float32/float64"
    for k, x in enumerate(xs):
        numel = x.numel()
        group = [a[k] for a in arrays]
        if not all(_dense(t, dtype, numel) for t in group):
            return None, (
                "the fused kernels need dense, contiguous CPU tensors of one dtype "
                "(float32 or float64) in a param group"
            )
        if numel and len({t.data_ptr() for t in group}) != len(group):
            return None, "a parameter shares memory with its gradient or state"
    return dtype, ""


def _check_steps(steps: Sequence[Tensor]) -> int | None:
    """1 when the step counters are float64, 0 for float32; ``None`` if not usable."""
    dtype = steps[0].dtype
    if dtype not in _DTYPES:
        return None
    for s in steps:
        if s.device.type != "cpu" or s.dtype != dtype or s.numel() != 1:
            return None
    return int(dtype == torch.float64)


def _threads() -> int:
    return max(1, torch.get_num_threads())


# --------------------------------------------------------------------------- AM-AdamW


def fused_am_adamw(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    state_steps: list[Tensor],
    beta1_prods: list[Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    weight_decay_mode: str,
    lam: float,
    per_layer: bool,
    variant: str | None,
    beta_min: float,
    theta: float,
    beta_high: float,
    beta_low: float,
    maximize: bool,
) -> tuple[list[Tensor], list[Tensor]] | str:
    """One AM-AdamW step with the fused kernels (in place), as ``_single_tensor_am_adamw``.

    Returns ``(betas, beta1_prods)`` like the other implementations, or a string
    saying why the kernels cannot run this group (nothing was modified then).
    """
    n = len(params)
    if n == 0:
        return [], []
    lib = library()
    if lib is None:
        return f"the fused kernels are unavailable ({_state['error']})"
    xs = [as_real(t) for t in params]
    gs = [as_real(t) for t in grads]
    ds = [as_real(t) for t in exp_avgs]
    vs = [as_real(t) for t in exp_avg_sqs]
    dtype, why = _check_arrays([xs, gs, ds, vs])
    if dtype is None:
        return why
    steps_double = _check_steps(state_steps)
    if steps_double is None:
        return "the step counters are not float CPU scalars"
    scope_prods = beta1_prods if per_layer else beta1_prods[:1]
    prods_in = [
        p if p.dtype == dtype and p.device.type == "cpu" else p.to("cpu", dtype)
        for p in scope_prods
    ]
    m = n if per_layer else 1
    shape = (m,) if per_layer else ()
    betas_t = torch.empty(shape, dtype=dtype)
    prods_t = torch.empty(shape, dtype=dtype)
    numel = (ctypes.c_int64 * n)(*[x.numel() for x in xs])
    hp = (ctypes.c_double * 10)(
        lr, beta1, beta2, eps, weight_decay, lam, beta_min, theta, beta_high, beta_low
    )
    flags = (ctypes.c_int64 * 6)(
        int(per_layer),
        _MODES[weight_decay_mode],
        int(maximize),
        _VARIANTS[variant],
        _threads(),
        steps_double,
    )
    fn = getattr(lib, f"am_adamw_{_SUFFIX[dtype]}")
    rc = fn(
        n,
        numel,
        _ptrs(xs),
        _ptrs(gs),
        _ptrs(ds),
        _ptrs(vs),
        _ptrs(state_steps),
        _ptrs(prods_in),
        betas_t.data_ptr(),
        prods_t.data_ptr(),
        hp,
        flags,
    )
    if rc != 0:
        raise MemoryError("the fused AM-AdamW kernel could not allocate its workspace")
    torch.autograd.graph.increment_version([*params, *exp_avgs, *exp_avg_sqs, *state_steps])
    if per_layer:
        return list(betas_t.unbind()), list(prods_t.unbind())
    return [betas_t] * n, [prods_t] * n


# --------------------------------------------------------------------------- AMSGD


def fused_amsgd(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffer_list: list[Tensor | None],
    state_steps: list[Tensor],
    *,
    lr: float,
    lam: float,
    beta_max: float,
    weight_decay: float,
    per_layer: bool,
    variant: str | None,
    beta_min: float,
    theta: float,
    beta_high: float,
    beta_low: float,
    maximize: bool,
) -> list[Tensor] | str:
    """One AMSGD step with the fused kernels (in place), as ``_single_tensor_amsgd``.

    A ``None`` momentum buffer is created as the gradient (step 0). Returns the
    betas, or a string saying why the kernels cannot run this group (nothing
    was modified then).
    """
    n = len(params)
    if n == 0:
        return []
    lib = library()
    if lib is None:
        return f"the fused kernels are unavailable ({_state['error']})"
    xs = [as_real(t) for t in params]
    gs = [as_real(t) for t in grads]
    dtype, why = _check_arrays([xs, gs])
    if dtype is None:
        return why
    bufs = [None if b is None else as_real(b) for b in momentum_buffer_list]
    for k, b in enumerate(bufs):
        if b is not None and (
            not _dense(b, dtype, xs[k].numel())
            or b.data_ptr() in (xs[k].data_ptr(), gs[k].data_ptr())
        ):
            return "a momentum buffer is not a dense contiguous tensor like its parameter"
    steps_double = _check_steps(state_steps)
    if steps_double is None:
        return "the step counters are not float CPU scalars"
    for k, b in enumerate(bufs):
        if b is None:  # step 0: d = g, formed as in _single_tensor_amsgd
            # (the kernel forms g with its own rounding: d - g is then 0 or an ulp, and the
            # zero-denominator guard gives beta = 0, as on step 0 of the reference)
            grad = -grads[k] if maximize else grads[k]
            if weight_decay != 0:
                grad = grad.add(params[k], alpha=weight_decay)
            buf = torch.clone(grad).detach()
            momentum_buffer_list[k] = buf
            bufs[k] = as_real(buf)
    betas_t = torch.empty((n,) if per_layer else (), dtype=dtype)
    numel = (ctypes.c_int64 * n)(*[x.numel() for x in xs])
    hp = (ctypes.c_double * 8)(
        lr, lam, beta_max, weight_decay, beta_min, theta, beta_high, beta_low
    )
    flags = (ctypes.c_int64 * 5)(
        int(per_layer), int(maximize), _VARIANTS[variant], _threads(), steps_double
    )
    fn = getattr(lib, f"am_sgd_{_SUFFIX[dtype]}")
    fn(
        n,
        numel,
        _ptrs(xs),
        _ptrs(gs),
        _ptrs(bufs),
        _ptrs(state_steps),
        betas_t.data_ptr(),
        hp,
        flags,
    )
    torch.autograd.graph.increment_version(
        [*params, *[b for b in momentum_buffer_list if b is not None], *state_steps]
    )
    return list(betas_t.unbind()) if per_layer else [betas_t] * n
