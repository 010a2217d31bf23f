"""``minimize(method="am-mgd")`` against a hand-written NumPy heavy-ball loop on a9a.

Each timed call runs the same number of iterations (lr = 1/L), both from the
same point near the minimiser; divide by ``ITERATIONS`` for the time per
iteration. Skipped when the a9a file is absent (``$AMOPT_A9A`` or
``../shared/data/libsvm/a9a``).
"""

from __future__ import annotations

from amopt.bench import cases

ITERATIONS = 100


class TimeMinimizeA9a:
    params = (["am-mgd", "heavy-ball"],)
    param_names = ["method"]
    timeout = 300

    def setup(self, method: str) -> None:
        k = 5 if cases.quick() else ITERATIONS
        try:
            self.case = cases.MinimizeCase(method, iterations=k)
        except cases.SkipCase as exc:
            raise NotImplementedError(str(exc)) from None

    def time_iterations(self, method: str) -> None:
        self.case.run()
