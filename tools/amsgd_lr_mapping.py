"""How ``AMSGD``'s lr maps from ``torch.optim.SGD(lr=a, momentum=m)``: a measurement.

AM's update is a damped average, ``d = g + gamma (d - g)`` with
``gamma = (beta + lam) / (1 + lam)``, where torch's heavy ball sums,
``b = m b + g``; in steady state ``b ~ g / (1 - m)`` and ``d ~ g``, so the same step
needs ``lr ~ a / (1 - m)``. This script measures it on two problems:

* digits (scikit-learn's bundled 8x8 digits, 1797 images): an MLP 64-64-10, mini-batches
  of 32, 5 epochs, float32; the mean training cross-entropy after the last epoch,
  median of 3 seeds;
* least squares 200x20 (condition 10), full batch, float64: steps until
  ``f - f* <= 1e-10 (f0 - f*)`` (at most 2000).

Run: ``python tools/amsgd_lr_mapping.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import statistics

import numpy as np
import torch

from amopt.torch import AMSGD


def _digits():
    from sklearn.datasets import load_digits

    data = load_digits()
    X = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.int64)
    return X, y


def digits_loss(make, seed, epochs=5, batch=32):
    X, y = _digits()
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = make(model.parameters())
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(X), generator=g)
        for k in range(0, len(X), batch):
            idx = order[k : k + batch]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(X[idx]), y[idx]).backward()
            opt.step()
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(X), y))


def least_squares(seed=0, n=200, d=20, cond=10.0):
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((n, d)))
    V, _ = np.linalg.qr(rng.standard_normal((d, d)))
    s = np.sqrt(np.geomspace(1.0, cond, d))  # condition of A^T A is cond
    A = torch.tensor(U @ np.diag(s) @ V.T)
    b = torch.tensor(rng.standard_normal(n))
    x_star = torch.linalg.lstsq(A, b.unsqueeze(1)).solution.squeeze(1)
    L = float(torch.linalg.matrix_norm(A, 2) ** 2)
    return A, b, x_star, L


def ls_steps(make, A, b, x_star, tol=1e-10, max_steps=2000):
    def f(x):
        return 0.5 * float(((A @ x - b) ** 2).sum())

    x = torch.nn.Parameter(torch.zeros(A.shape[1], dtype=torch.float64))
    f_star, f0 = f(x_star), f(x.detach())
    opt = make([x])
    for t in range(1, max_steps + 1):
        opt.zero_grad()
        (0.5 * ((A @ x - b) ** 2).sum()).backward()
        opt.step()
        if f(x.detach()) - f_star <= tol * (f0 - f_star):
            return t
    return None


def main():
    m = 0.9
    print("digits MLP, 5 epochs, batch 32: final training loss (median of 3 seeds)")
    for a in (0.01, 0.05):
        rows = {
            f"SGD(lr={a}, momentum={m})": lambda p, a=a: torch.optim.SGD(p, lr=a, momentum=m),
            f"AMSGD(lr={a}, momentum={m})": lambda p, a=a: AMSGD(p, lr=a, momentum=m),
            f"AMSGD(lr={a / (1 - m):.3g}, momentum={m})  [a/(1-m)]": lambda p, a=a: AMSGD(
                p, lr=a / (1 - m), momentum=m
            ),
        }
        for name, make in rows.items():
            losses = [digits_loss(make, seed) for seed in range(3)]
            print(f"  {name:48s} {statistics.median(losses):.4f}")
    print("AMSGD(momentum=0.9) lr grid on digits:")
    for lr in (0.05, 0.1, 0.2, 0.5, 1.0):
        losses = [digits_loss(lambda p, lr=lr: AMSGD(p, lr=lr, momentum=m), s) for s in range(3)]
        print(f"  lr={lr:<5} {statistics.median(losses):.4f}")

    A, b, x_star, L = least_squares()
    a = 1.0 / L
    print(f"least squares 200x20, condition 10, lr a = 1/L = {a:.4g}: steps to 1e-10")
    rows = {
        "GD (SGD momentum=0, lr=a)": lambda p: torch.optim.SGD(p, lr=a),
        f"SGD(lr=a, momentum={m})": lambda p: torch.optim.SGD(p, lr=a, momentum=m),
        f"AMSGD(lr=a, momentum={m})": lambda p: AMSGD(p, lr=a, momentum=m),
        f"AMSGD(lr=a/(1-m), momentum={m})": lambda p: AMSGD(p, lr=a / (1 - m), momentum=m),
    }
    for name, make in rows.items():
        print(f"  {name:40s} {ls_steps(make, A, b, x_star)}")


if __name__ == "__main__":
    main()
