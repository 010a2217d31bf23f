r"""
Telemetry of a training run: beta_t per layer with latest_betas()
=================================================================

Every optimizer of :mod:`amopt.torch` computes its momentum coefficient
:math:`\beta_t` at every step, and ``latest_betas()`` returns the values it just applied:
one list per param group, one 0-d tensor per parameter, on the parameters' device. They
are the optimizer's own state tensors, so reading them launches no kernel and waits for
nothing; the usual way to log them is to copy them into a device buffer every step
(``torch.stack``) and bring the buffer to the host once, at the end or every few hundred
steps, as one would log a loss without ``loss.item()`` at every step.

Here a small convolutional network learns a synthetic ten-class image task with
:class:`amopt.torch.AMSGD` (``per_layer=True``: one :math:`\beta_t` per tensor) under a
cosine learning-rate schedule, and we plot :math:`\beta_t` per layer over the run.
"""

import matplotlib.pyplot as plt
import torch

from amopt.torch import AMSGD

torch.set_num_threads(1)  # a network this small runs fastest on one thread

# %%
# The task: 16 x 16 single-channel images, each class a fixed random template, plus noise.
torch.manual_seed(0)
templates = torch.randn(10, 1, 16, 16)
labels = torch.randint(0, 10, (4096,))
images = templates[labels] + 1.5 * torch.randn(4096, 1, 16, 16)

model = torch.nn.Sequential(
    torch.nn.Conv2d(1, 8, 3, padding=1),
    torch.nn.ReLU(),
    torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(8, 16, 3, padding=1),
    torch.nn.ReLU(),
    torch.nn.MaxPool2d(2),
    torch.nn.Flatten(),
    torch.nn.Linear(16 * 4 * 4, 10),
)
names = [name for name, _ in model.named_parameters()]

steps = 300
opt = AMSGD(model.parameters(), lr=0.05, per_layer=True)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
cap = opt.param_groups[0]["beta_max"]  # the largest beta_t the rule may apply

# %%
# The training loop. ``latest_betas()[0]`` is the list for the only param group; its
# stack is a copy (the state tensors are updated in place by the next step), written into a
# preallocated buffer on the parameters' device. Nothing here reads a value on the host
# but the loss log, which keeps its tensors too.
device = next(model.parameters()).device
beta_log = torch.empty(steps, len(names), device=device)
loss_log = torch.empty(steps, device=device)
gen = torch.Generator().manual_seed(1)
for t in range(steps):
    idx = torch.randint(0, images.shape[0], (64,), generator=gen)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(images[idx]), labels[idx])
    loss.backward()
    opt.step()
    sched.step()
    beta_log[t] = torch.stack(opt.latest_betas()[0])
    loss_log[t] = loss.detach()

with torch.no_grad():
    accuracy = (model(images).argmax(1) == labels).float().mean().item()
print(f"training accuracy after {steps} steps: {accuracy:.1%}")
print("beta_t applied at the last step, per tensor:", [round(b, 3) for b in beta_log[-1].tolist()])

# %%
# :math:`\beta_t` per layer (a moving average over 20 steps; the raw values, light, behind
# it; the axis starts at 0.5) and the loss. The dotted line is the cap ``beta_max`` (exposed
# to schedulers as ``momentum``). The biases and weights of one layer get their own
# :math:`\beta_t`: with ``per_layer=False`` (the default) every tensor of a param group
# shares one.


def smooth(values, k=20):
    return torch.nn.functional.avg_pool1d(values[None, None], k, 1).flatten()


fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), width_ratios=(2, 1))
for j, name in enumerate(names):
    (line,) = ax1.plot(smooth(beta_log[:, j]), lw=1.3, label=name)
    ax1.plot(beta_log[:, j], lw=0.4, alpha=0.25, color=line.get_color())
ax1.axhline(cap, color="k", lw=0.6, ls=":")
ax1.set_ylim(0.5, cap + 0.03)  # the first step's beta_t is 0 (no momentum yet), a few dip below
ax1.set(xlabel="step", ylabel=r"$\beta_t$", title=r"AMSGD(per_layer=True): $\beta_t$ per tensor")
ax1.legend(fontsize=7, ncol=2)
ax2.semilogy(smooth(loss_log))
ax2.set(xlabel="step", ylabel="cross-entropy", title="mini-batch loss (smoothed)")
fig.tight_layout()
plt.show()

# %%
# A summary per tensor, from the same log: the mean of :math:`\beta_t` over the first and
# the last third of the run, and the share of steps at the cap.
third = steps // 3
for j, name in enumerate(names):
    col = beta_log[:, j]
    at_cap = (col >= cap - 1e-6).float().mean().item()
    print(
        f"{name:9s} mean beta_t {col[:third].mean().item():.3f} (first third), "
        f"{col[-third:].mean().item():.3f} (last third), at the cap {at_cap:.0%} of the steps"
    )
