"""The array-API core: one AM-MGD step against one MGD step, per available backend.

``am_momentum_step`` (exact numerator) and ``heavy_ball_step`` on 10^7 float64
elements (NumPy, torch CPU, and CuPy / torch CUDA when a GPU is present, with a
device synchronisation after each step). Both are pure functions.
"""

from __future__ import annotations

from amopt.bench import cases


class TimeCoreStep:
    params = (cases.array_backends(), ["am-mgd", "mgd"])
    param_names = ["backend", "method"]
    timeout = 300

    def setup(self, backend: str, method: str) -> None:
        n = 100_000 if cases.quick() else 10_000_000
        try:
            self.case = cases.CoreStepCase(method, n, backend)
        except cases.SkipCase as exc:
            raise NotImplementedError(str(exc)) from None
        self.case.run()

    def time_step(self, backend: str, method: str) -> None:
        self.case.run()
