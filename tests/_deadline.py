"""A deadline for tests that start clusters or processes: a hang fails instead of blocking."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise ``TimeoutError`` naming ``what`` if the block runs longer than ``seconds``."""

    def expire(signum, frame):
        raise TimeoutError(f"{what} did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
