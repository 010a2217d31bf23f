"""Where a GPU step's time goes: host time, time to completion and profiles.

    python tools/gpu_profile.py train [cuda|cpu]     GPT-2 small training steps (transformers)
    python tools/gpu_profile.py compiled [cuda|cpu]  torch.compile(step), 52 bf16 tensors
    python tools/gpu_profile.py history              the reduce-overhead test with the
                                                     allocation history of CUDA graph pools

``train``: the host time of ``step()`` (until it returns) and its time until the GPU has
finished, for ``AMAdamW()`` and ``AdamW(fused=True)`` stepping in turn on one model with
new gradients at every iteration, then on kept gradients, then a torch.profiler table of
one step of each. ``compiled``: the same times for compiled steps and a cProfile of the
host work. ``cpu`` runs a small model on the CPU (a dry run of the script).
"""

import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

# the harness (benchmarks/, outside the package) from the checkout holding this script
sys.path.append(str(Path(__file__).resolve().parents[1]))

part = sys.argv[1]
dev = sys.argv[2] if len(sys.argv) > 2 else "cuda"
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)


def prof_table(fn, label, n=1):
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    sync()
    with profile(activities=acts) as prof:
        for _ in range(n):
            fn()
        sync()
    ka = prof.key_averages()
    print(f"--- {label}: top by self CPU time")
    print(ka.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))
    if dev == "cuda":
        print(f"--- {label}: top by CUDA time")
        print(ka.table(sort_by="self_cuda_time_total", row_limit=10, max_name_column_width=60))


def host_and_total(step, k=10):
    host, total = [], []
    for _ in range(k):
        sync()
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        sync()
        host.append(t1 - t0)
        total.append(time.perf_counter() - t0)
    return statistics.median(host) * 1e3, statistics.median(total) * 1e3


def cprof(fn, k, label, rows=22):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(k):
        fn()
    sync()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(rows)
    print(f"--- {label}: cProfile of {k} calls, by tottime")
    print("\n".join(line[:170] for line in s.getvalue().splitlines()[4:]))


if part == "train":
    from transformers import GPT2Config, GPT2LMHeadModel

    from amopt.torch import AMAdamW

    torch.manual_seed(0)
    cfg = (
        GPT2Config()
        if dev == "cuda"
        else GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64)
    )
    b, s = (4, 512) if dev == "cuda" else (2, 32)
    model = GPT2LMHeadModel(cfg).to(dev).train()
    ids = torch.randint(0, cfg.vocab_size, (b, s), device=dev)
    params = list(model.parameters())
    opts = {
        "AMAdamW": AMAdamW(params, lr=1e-4, weight_decay=1e-2),
        "AdamW(fused)": torch.optim.AdamW(params, lr=1e-4, weight_decay=1e-2, fused=dev == "cuda"),
    }

    def fb():
        model.zero_grad(set_to_none=True)
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()

    for _ in range(3):
        for o in opts.values():
            fb()
            o.step()
    for name, o in opts.items():
        hs, ts = [], []
        for _ in range(8):
            fb()
            h, t = host_and_total(o.step, 1)
            hs.append(h)
            ts.append(t)
            for other in opts.values():  # as in the bench: the optimizers alternate
                if other is not o:
                    fb()
                    other.step()
        host, total = statistics.median(hs), statistics.median(ts)
        print(f"train {name}: step host {host:.3f} ms, step total {total:.3f} ms")
    # the same optimizers alone (gradients kept): the standalone row's setting
    for name, o in opts.items():
        fb()
        h, t = host_and_total(o.step, 8)
        print(f"kept grads {name}: step host {h:.3f} ms, step total {t:.3f} ms")
    grads_path = [p.grad.is_contiguous() and p.grad.data_ptr() % 16 == 0 for p in params]
    print("grads contiguous+aligned:", all(grads_path), "dtypes", {p.grad.dtype for p in params})
    fb()
    prof_table(opts["AMAdamW"].step, "AMAdamW step after backward")
    fb()
    prof_table(opts["AdamW(fused)"].step, "AdamW(fused) step after backward")

elif part == "compiled":
    from amopt.torch import AMAdamW
    from benchmarks.gpu import _shapes, gpu_params

    for name in ("AMAdamW", "AdamW"):
        params = (
            gpu_params(_shapes("gpt2-4", dev != "cuda"), "bfloat16")
            if dev == "cuda"
            else [torch.nn.Parameter(torch.randn(8, 4)) for _ in range(4)]
        )
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        opt = (
            AMAdamW(params, lr=1e-4, weight_decay=1e-2)
            if name == "AMAdamW"
            else torch.optim.AdamW(params, lr=1e-4, weight_decay=1e-2)
        )
        step = torch.compile(opt.step)
        t0 = time.perf_counter()
        for _ in range(3):
            step()
        sync()
        print(f"compiled {name}: first 3 steps {time.perf_counter() - t0:.1f} s")
        h, t = host_and_total(step, 20)
        print(f"compiled {name}: host {h:.3f} ms, total {t:.3f} ms")
        cprof(step, 20, f"compiled {name}")

elif part == "history":
    import torch._inductor.config as cfg

    cfg.triton.cudagraph_trees_history_recording = True
    import pytest

    sys.exit(
        pytest.main(
            [
                "-q",
                "-x",
                "-p",
                "no:cacheprovider",
                "--tb=long",
                "tests/test_triton_cuda.py::test_reduce_overhead_compile",
            ]
        )
    )
