"""A training iteration of a tiny LLaMA with AdamW and with AM-AdamW (the paper's overhead).

``transformers`` builds the model from a config (no download); skipped when it
is not installed. Forward, backward and ``step()`` on a batch of 16 x 256 tokens, with
each implementation of the optimizers (fused, foreach, default flags, compiled step).
"""

from __future__ import annotations

from amopt.bench import cases


class TimeLlamaIteration:
    params = (["adamw", "am-adamw"], list(cases.LLAMA_PATHS))
    param_names = ["optimizer", "path"]
    timeout = 600

    def setup(self, optimizer: str, path: str) -> None:
        size = {"batch": 2, "seq_len": 32, "hidden": 64, "layers": 2, "vocab": 512}
        try:
            self.case = cases.LlamaCase(optimizer, path=path, **(size if cases.quick() else {}))
        except cases.SkipCase as exc:
            raise NotImplementedError(str(exc)) from None
        self.case.run()
        if path == "compiled":
            self.case.run()  # compiled at the first step; the second one runs it

    def time_iteration(self, optimizer: str, path: str) -> None:
        self.case.run()
