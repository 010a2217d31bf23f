"""Spawned torch.distributed (gloo, CPU) workers for the tests: one way to start, end and
collect them, with a deadline so that a hung rank fails its test instead of blocking."""

from __future__ import annotations

import os
import socket
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def init_rank(rank: int, port: int, world_size: int) -> None:
    """Join the gloo group of ``world_size`` ranks on ``port`` (one torch thread each)."""
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def exit_without_teardown() -> None:
    """End a worker whose results are saved without the interpreter's teardown.

    gloo's and OpenMP's background threads can abort a process at interpreter exit
    ("terminate called without an active exception") on a loaded machine; that is no
    part of what these tests check, and a worker that failed earlier never gets here.
    """
    os._exit(0)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(worker, nprocs: int, timeout_s: float) -> list:
    """Run ``worker(rank, port, out_dir)`` on ``nprocs`` ranks; each saves
    ``out_dir/rank{r}.pt``, returned in rank order. A rank still running after
    ``timeout_s`` fails the test."""
    with tempfile.TemporaryDirectory(prefix="amopt-dist-") as out_dir:
        context = mp.start_processes(
            worker, args=(free_port(), out_dir), nprocs=nprocs, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                for proc in context.processes:
                    proc.kill()
                pytest.fail(f"the distributed workers did not finish within {timeout_s} s")
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(nprocs)]
