"""The LLM experiment's AM-AdamW runs under its schedule, with the paper's rule (r =
lr_{t-1}/lr_t, amopt today) and with the constant-lr rule amopt used before (r = 1).

Runs the 0.18M tiny-LLaMA of ``python -m amopt.experiments llm`` (same data, steps,
schedule and settings), AM-AdamW with and without warm-up, for the given seeds, and
prints the final validation losses of both rules beside each other. Needs transformers
and tiny-shakespeare (``--data-dir`` or the experiments' data folder).

    python tools/llm_schedule_rule.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace
from unittest import mock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()

    import torch
    import transformers

    from amopt.core import rule as _rule
    from amopt.experiments import llm
    from amopt.experiments._data import load_text, split_text

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    cfg, size = llm.REAL, llm.SIZES["0.18M"]
    train, val = split_text(load_text(data_dir=args.data_dir, download=False), 0.1)
    ctx = SimpleNamespace(progress=lambda **kw: _NoBar())  # _train only draws a bar
    plan = llm._plan(cfg)
    print("run | seed | paper's rule (r) | constant-lr rule (r = 1)")
    for seed in args.seeds:
        for label in ("AM-AdamW (warm-up)", "AM-AdamW (no warm-up)"):
            out = []
            for rule in ("paper", "constant"):
                batches = llm._Batches(train, val, cfg, seed, "cpu")
                if rule == "paper":
                    r = llm._train(ctx, size, cfg, batches, label, plan[label], seed)
                else:
                    with mock.patch.object(_rule, "lr_ratio", lambda prev, lr: 1.0):
                        r = llm._train(ctx, size, cfg, batches, label, plan[label], seed)
                out.append(r["final_val_loss"])
            print(f"{label} | {seed} | {out[0]:.4f} | {out[1]:.4f}", flush=True)


class _NoBar:
    def __getattr__(self, name: str) -> object:
        return lambda *args, **kwargs: None

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, *args: object, **kwargs: object) -> None:
        pass

    def close(self) -> None:
        pass


if __name__ == "__main__":
    main()
