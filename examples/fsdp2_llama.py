"""Train a small LLaMA with FSDP2 (``fully_shard``) and AMAdamW on several processes.

Every parameter is a DTensor sharded over the ranks; the AM beta of each tensor
(``per_layer=True``) or of the whole model (``--global-scope``) is computed from the
sums of all shards, combined with one packed all-reduce per step. The script prints
the loss of every step, the bytes and the time of that extra all-reduce, and the
time of the whole step.

Runs on the CPU with gloo (or on GPUs with NCCL, one per process)::

    torchrun --nproc-per-node 2 examples/fsdp2_llama.py --steps 5

Needs ``transformers`` (``pip install transformers``).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

from amopt.torch import AMAdamW
from amopt.torch._distributed import comm_stats


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--global-scope", action="store_true", help="one beta for the model")
    parser.add_argument("--foreach", action="store_true", help="multi-tensor implementation")
    return parser.parse_args()


def batch(step: int, rank: int, args: argparse.Namespace, device: torch.device) -> torch.Tensor:
    """Token sequences with structure to learn: noisy arithmetic progressions mod vocab."""
    g = torch.Generator().manual_seed(10_000 * step + rank)
    start = torch.randint(args.vocab, (args.batch, 1), generator=g)
    stride = torch.randint(1, 8, (args.batch, 1), generator=g)
    tokens = (start + stride * torch.arange(args.seq_len)) % args.vocab
    noise = torch.rand(tokens.shape, generator=g) < 0.05
    tokens[noise] = torch.randint(args.vocab, (int(noise.sum()),), generator=g)
    return tokens.to(device)


def main() -> None:
    args = parse_args()
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = torch.device("cuda" if use_cuda else "cpu")
    mesh = init_device_mesh(device.type, (world,))

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.seq_len,
    )
    model = LlamaForCausalLM(config).to(device)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = AMAdamW(
        model.parameters(),
        lr=args.lr,
        weight_decay=0.1,
        per_layer=not args.global_scope,
        foreach=args.foreach,
    )
    n_params = sum(p.numel() for p in model.parameters())
    n_tensors = len(list(model.parameters()))
    if rank == 0:
        scope = "global" if args.global_scope else "per-layer"
        print(
            f"LLaMA {n_params / 1e6:.2f} M parameters in {n_tensors} tensors, FSDP2 over "
            f"{world} ranks ({dist.get_backend()}), AMAdamW {scope} beta",
            flush=True,
        )

    totals = {"bytes": 0, "seconds": 0.0, "step": 0.0}
    for step in range(args.steps):
        tokens = batch(step, rank, args, device)
        started = time.perf_counter()
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        comm_stats(reset=True)
        optimizer.step()
        optimizer.zero_grad()
        if use_cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        comm = comm_stats()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        betas = [float(b) for b in optimizer.latest_betas()[0]]
        if step > 0:  # the first step includes one-time set-up
            totals["bytes"] += comm["bytes"]
            totals["seconds"] += comm["seconds"]
            totals["step"] += elapsed
        if rank == 0:
            print(
                f"step {step:3d}  loss {mean_loss.item() / world:.4f}  "
                f"beta min/mean/max {min(betas):.3f}/{sum(betas) / len(betas):.3f}/"
                f"{max(betas):.3f}  extra all-reduce {comm['collectives']} x "
                f"{comm['bytes']} B in {1e3 * comm['seconds']:.3f} ms  "
                f"step {1e3 * elapsed:.1f} ms",
                flush=True,
            )
    if args.steps > 1:
        n = args.steps - 1
        latency = all_reduce_latency(totals["bytes"] // n, device)
        if rank == 0:
            print(
                f"per step (steps 1-{n}): extra all-reduce {totals['bytes'] // n} B, "
                f"{1e3 * totals['seconds'] / n:.3f} ms = "
                f"{100 * totals['seconds'] / totals['step']:.2f}% of the step "
                f"({1e3 * totals['step'] / n:.1f} ms); this includes waiting for the "
                f"slowest rank. The same all-reduce alone: {1e3 * latency:.3f} ms",
                flush=True,
            )
    dist.destroy_process_group()


def all_reduce_latency(nbytes: int, device: torch.device, repeats: int = 50) -> float:
    """Median time of an all-reduce of ``nbytes`` of float64, all ranks started together."""
    buf = torch.zeros(max(1, nbytes // 8), dtype=torch.float64, device=device)
    times = []
    for _ in range(repeats):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(buf)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


if __name__ == "__main__":
    main()
