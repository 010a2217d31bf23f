r"""
AMAdamW against AdamW on a small network, with beta_t per layer
===============================================================

A three-layer MLP learns a fixed random teacher network on synthetic data. We train it
twice from the same initial weights and the same batches, once with
:class:`torch.optim.AdamW` and once with :class:`amopt.torch.AMAdamW` (one
:math:`\beta_t` per tensor), and log :math:`\beta_t` of every tensor with
``latest_betas()`` (device tensors: no host synchronisation inside the step).
"""

import matplotlib.pyplot as plt
import torch

from amopt.torch import AMAdamW

torch.set_num_threads(1)  # a network this small runs fastest on one thread
torch.manual_seed(0)
teacher = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
X = torch.randn(2048, 16)
with torch.no_grad():
    Y = teacher(X) + 0.01 * torch.randn(2048, 1)


def make_model():
    torch.manual_seed(1)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 1),
    )


def train(opt_class, steps=300, **kwargs):
    model = make_model()
    opt = opt_class(model.parameters(), lr=3e-3, weight_decay=1e-4, **kwargs)
    gen = torch.Generator().manual_seed(2)
    losses, betas = [], []
    for _ in range(steps):
        idx = torch.randint(0, X.shape[0], (64,), generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(X[idx]), Y[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if hasattr(opt, "latest_betas"):
            betas.append(torch.stack(opt.latest_betas()[0]).tolist())
    with torch.no_grad():
        full = torch.nn.functional.mse_loss(model(X), Y).item()
    names = [name for name, _ in model.named_parameters()]
    return losses, betas, full, names


adamw_losses, _, adamw_full, _ = train(torch.optim.AdamW)
am_losses, am_betas, am_full, names = train(AMAdamW)
print(f"full-data loss after 300 steps: AdamW {adamw_full:.5f}, AMAdamW {am_full:.5f}")

# %%
# Loss curves (mini-batch loss, smoothed over 10 steps) and :math:`\beta_t` per tensor
# (capped at ``betas[0] = 0.9``), and the share of steps each tensor spent at the cap.


def smooth(values, k=10):
    t = torch.tensor(values)
    return torch.nn.functional.avg_pool1d(t[None, None], k, 1).flatten().tolist()


fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
ax1.semilogy(smooth(adamw_losses), label="AdamW")
ax1.semilogy(smooth(am_losses), label="AMAdamW")
ax1.set(xlabel="step", ylabel="mini-batch MSE", title="training loss")
ax1.legend()
per_tensor = torch.tensor(am_betas)  # (steps, tensors)
# beta_t jumps from step to step: one row per tensor, coloured by beta_t
image = ax2.imshow(per_tensor.T, aspect="auto", interpolation="nearest", vmin=0, vmax=0.9)
ax2.set_yticks(range(len(names)), names, fontsize=8)
ax2.set(xlabel="step", title=r"AMAdamW: $\beta_t$ per tensor")
fig.colorbar(image, ax=ax2, label=r"$\beta_t$")
fig.tight_layout()
plt.show()

for j, name in enumerate(names):
    at_cap = (per_tensor[:, j] >= 0.9 - 1e-6).float().mean().item()
    print(f"{name:9s} mean beta_t {per_tensor[:, j].mean().item():.3f}, at the cap {at_cap:.0%}")
