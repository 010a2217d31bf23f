"""Host-side costs that stand in on the CPU for GPU costs (``benchmarks.host``).

* the Triton driver's host time per step of ``AMAdamW()`` / ``AMSGD()`` with every
  kernel launch stubbed, at GPT-2 small's layout (148 tensors) and with its
  parameters in 1480 tensors (the ``triton-host-*`` rows of ``python -m benchmarks``),
  and a compiled step at 148 tensors;
* aten operations per foreach step, AM against torch (``foreach-ops*``);
* host synchronisations and aten operations per iteration of ``amopt.minimize`` on
  torch tensors (``minimize-syncs``, ``minimize-ops``), and the host time of its
  iterations on tiny torch problems next to the hand-written loops (``minimize-host-*``).

Counts are ``track_`` benchmarks: asv records them per commit like a time.
"""

from __future__ import annotations

from amopt.bench import cases
from benchmarks import host as _host
from benchmarks import standins as _standins

N_TENSORS = [148, 1480]


class TimeTritonDriverHost:
    """One step on the Triton driver with its launches stubbed: the driver's host work."""

    params = (["am_adamw", "amsgd"], N_TENSORS)
    param_names = ["optimizer", "tensors"]
    timeout = 300
    warmup_time = 0.2

    def setup(self, optimizer: str, tensors: int) -> None:
        try:
            self.case = _host.TritonHostCase(optimizer, _standins.layout(tensors, cases.quick()))
        except cases.SkipCase as exc:  # no triton here
            raise NotImplementedError(str(exc)) from None

    def time_step(self, optimizer: str, tensors: int) -> None:
        self.case.run()

    def track_launches_per_step(self, optimizer: str, tensors: int) -> float:
        """Kernel launches of one step (a host-light driver: independent of ``tensors``)."""
        before = sum(self.case.launches.values())
        self.case.run()
        return float(sum(self.case.launches.values()) - before)

    track_launches_per_step.unit = "launches"  # type: ignore[attr-defined]


class TimeTritonDriverHostCompiled:
    """One ``torch.compile``-d step on the Triton driver, launches stubbed: the host work of
    the compiled step (graph guards, the operator's boundary, the driver inside it).
    AMAdamW only (its operator is AMSGD's with more lists): compiling takes a while."""

    params = (["am_adamw"],)
    param_names = ["optimizer"]
    timeout = 600
    warmup_time = 0.2

    def setup(self, optimizer: str) -> None:
        try:
            shapes = _standins.layout(148, cases.quick())
            self.case = _host.TritonHostCase(optimizer, shapes, compiled=True)
        except cases.SkipCase as exc:  # no triton here
            raise NotImplementedError(str(exc)) from None

    def time_step(self, optimizer: str) -> None:
        self.case.run()


class TrackForeachOps:
    """aten operations of one foreach step (the second; the first creates the state)."""

    params = (["am_adamw_foreach", "adamw_foreach", "amsgd_foreach", "sgd_foreach"], N_TENSORS)
    param_names = ["optimizer", "tensors"]
    timeout = 600

    def track_aten_ops(self, kind: str, tensors: int) -> int:
        return _host.foreach_step_ops(kind, _standins.layout(tensors, cases.quick())).total_ops

    track_aten_ops.unit = "ops"  # type: ignore[attr-defined]


class TrackMinimizeHostCounts:
    """Host synchronisations and aten operations per iteration of ``minimize`` (torch)."""

    params = (
        list(dict.fromkeys(_host.FULL_BATCH_METHODS + _host.MINI_BATCH_METHODS)),
        ["full batch", "mini-batch"],
    )
    param_names = ["method", "sampling"]
    timeout = 300

    def setup(self, method: str, sampling: str) -> None:
        batch = sampling == "mini-batch"
        if method not in (_host.MINI_BATCH_METHODS if batch else _host.FULL_BATCH_METHODS):
            raise NotImplementedError(f"{method} does not sample mini-batches")
        self.counts = _host.minimize_counts(method, batch=batch, n=200 if cases.quick() else 1000)

    def track_syncs_per_iteration(self, method: str, sampling: str) -> float:
        return self.counts["syncs"]

    track_syncs_per_iteration.unit = "syncs"  # type: ignore[attr-defined]

    def track_ops_per_iteration(self, method: str, sampling: str) -> float:
        return self.counts["ops"]

    track_ops_per_iteration.unit = "ops"  # type: ignore[attr-defined]


class TimeMinimizeHost:
    """Iterations of ``minimize`` on tiny torch problems, and of the hand-written loops
    they are measured against (``method`` "hand"): the host work of an iteration, what a
    GPU iteration waits for (:func:`benchmarks.standins.host_time_setup`)."""

    params = (["mgd", "am-mgd", "hand"], ["full batch"])
    param_names = ["method", "sampling"]
    timeout = 300
    warmup_time = 0.2

    def setup(self, method: str, sampling: str) -> None:
        self.run, self.k = _standins.host_time_setup(
            None if method == "hand" else method, sampling == "mini-batch", cases.quick()
        )

    def time_iterations(self, method: str, sampling: str) -> None:
        self.run(self.k)


class TimeMinimizeHostMiniBatch(TimeMinimizeHost):
    """:class:`TimeMinimizeHost` for ``am-sgd`` at batch 256 and the hand mini-batch
    heavy-ball loop."""

    params = (["am-sgd", "hand"], ["mini-batch"])
