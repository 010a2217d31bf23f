"""Torch optimizer steps: time, peak memory and state size, AM against torch's baselines.

The cases of ``python -m amopt.bench``: AM-AdamW against AdamW on 25M float32
parameters (48 tensors with per-layer beta, one tensor with a global beta) with each
implementation (default flags, ``fused=True``, ``foreach=True``, default flags with
``step`` under ``torch.compile``, ``fused=True`` stepped with a ``GradScaler``'s scale),
and AMSGD against ``SGD(momentum=0.9,
dampening=0.9)`` (default flags, fused, foreach; per-layer and global beta). On CUDA
the fused CPU kernels do not apply; the other paths are timed there, with a device
synchronisation after every step.
"""

from __future__ import annotations

from amopt.bench import cases

LAYOUTS = ("48 tensors, per-layer beta", "1 tensor, global beta")
#: AMSGD's default scope is the param group (global beta); per-layer as in the Adam rows
SGD_LAYOUTS = ("48 tensors, per-layer beta", "48 tensors, global beta")
ADAM_KINDS = (
    "am_adamw_default",
    "adamw_default",
    "am_adamw_fused",
    "adamw_fused",
    "am_adamw_foreach",
    "adamw_foreach",
    "am_adamw_compiled",
    "adamw_compiled",
    "am_adamw_fused_amp",
    "adamw_fused_amp",
)
SGD_KINDS = ("amsgd_default", "sgd_default", "amsgd_fused", "sgd_foreach", "amsgd_foreach")


def _sizes(layout: str) -> tuple[int, int, bool]:
    n = 200_000 if cases.quick() else 25_000_000
    if layout.startswith("48"):
        return n, (8 if cases.quick() else 48), True
    return n, 1, False


def _case(kind: str, layout: str, device: str) -> cases.OptimizerCase:
    if device == "cuda" and "_fused" in kind and not kind.startswith("adamw"):
        raise NotImplementedError("the fused AM kernels are CPU kernels")
    n, t, per_layer = _sizes(layout)
    try:
        return cases.OptimizerCase(kind, n, t, per_layer=per_layer, device=device)
    except cases.SkipCase as exc:
        raise NotImplementedError(str(exc)) from None


class TimeAdamFamilyStep:
    """One ``step()`` of AM-AdamW and torch's AdamW, 25M float32 parameters."""

    params = (list(ADAM_KINDS), list(LAYOUTS), cases.torch_devices() or ["cpu"])
    param_names = ["optimizer", "layout", "device"]
    timeout = 600
    warmup_time = 0.5

    def setup(self, kind: str, layout: str, device: str) -> None:
        self.case = _case(kind, layout, device)
        self.case.run()  # builds the fused kernels and the optimizer state

    def time_step(self, kind: str, layout: str, device: str) -> None:
        self.case.run()

    def track_state_bytes(self, kind: str, layout: str, device: str) -> int:
        """Bytes of optimizer state after a step (AMAdamW: the same as AdamW, plus scalars)."""
        return self.case.state_bytes()

    track_state_bytes.unit = "bytes"  # type: ignore[attr-defined]


class TimeFusedAdamTrafficFloor:
    """The memory traffic of a fused AM-AdamW step without its arithmetic (CPU).

    ``amopt.torch._fused.adam_traffic`` on the tensors of ``am_adamw_fused``: a floor of
    that step's time on this machine, to read against ``adamw_fused``.
    """

    params = (list(LAYOUTS),)
    param_names = ["layout"]
    timeout = 600
    warmup_time = 0.5

    def setup(self, layout: str) -> None:
        n, t, per_layer = _sizes(layout)
        try:
            self.case = cases.TrafficCase(n, t, per_layer=per_layer)
            self.case.run()
        except (cases.SkipCase, RuntimeError) as exc:  # no fused kernels here
            raise NotImplementedError(str(exc)) from None

    def time_two_passes(self, layout: str) -> None:
        self.case.run()


class TimeCompiledSGDReadFloor:
    """A compiled read of every gradient and momentum buffer, then the compiled SGD step
    (``amsgd-compiled-floor``): the least a two-pass compiled AMSGD step costs here."""

    timeout = 600
    warmup_time = 0.5

    def setup(self) -> None:
        n, t, _ = _sizes(LAYOUTS[0])
        self.case = cases.ReadFloorCase(n, t)
        self.case.run()

    def time_read_and_step(self) -> None:
        self.case.run()


class TimeSGDFamilyStep:
    """One ``step()`` of AMSGD and torch's SGD with (dampened) momentum."""

    params = (list(SGD_KINDS), list(SGD_LAYOUTS), cases.torch_devices() or ["cpu"])
    param_names = ["optimizer", "layout", "device"]
    timeout = 600
    warmup_time = 0.5

    def setup(self, kind: str, layout: str, device: str) -> None:
        if device == "cuda" and kind == "amsgd_fused":
            raise NotImplementedError("the fused AM kernels are CPU kernels")
        n, t, _ = _sizes(LAYOUTS[0])
        per_layer = layout == SGD_LAYOUTS[0]
        try:
            self.case = cases.OptimizerCase(kind, n, t, per_layer=per_layer, device=device)
        except cases.SkipCase as exc:
            raise NotImplementedError(str(exc)) from None
        self.case.run()

    def time_step(self, kind: str, layout: str, device: str) -> None:
        self.case.run()


class PeakMemAdamFamily:
    """Peak resident memory of parameters, gradients, optimizer state and three steps.

    Parameters and gradients (200 MB at full size) are allocated in ``setup``; asv's
    ``peakmem`` is the peak of the whole process, so the difference between two
    optimizers is what each adds: its state and any temporaries of its step.
    """

    params = (["am_adamw_fused", "adamw_fused", "am_adamw_foreach"],)
    param_names = ["optimizer"]
    timeout = 600

    def setup(self, kind: str) -> None:
        self.kind = kind
        self.n, self.t, _ = _sizes(LAYOUTS[0])
        # parameters and gradients only: the optimizer is created in the measured body
        self.case = cases.OptimizerCase("sgd_foreach", self.n, self.t)

    def peakmem_three_steps(self, kind: str) -> None:
        opt = cases.make_optimizer(kind, self.case.params, True)
        for _ in range(3):
            opt.step()
