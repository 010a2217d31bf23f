"""Small real training runs: AMSGD and AMAdamW reduce the loss on real data sets.

* L2-regularised logistic regression on LIBSVM ``mushrooms`` (8124 x 112),
  mini-batches of 64, float64.
* A 784-64-10 MLP on a 2000-image subset of Fashion-MNIST (``t10k`` files read
  with ``gzip`` + NumPy), mini-batches of 64, float64, evaluated on the next
  1000 images.

Everything is seeded and in float64, so the losses are asserted against values
measured with this code (relative tolerance 1e-6, which absorbs BLAS
summation-order differences between machines; accuracies to within 3 samples).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from amopt.torch import AMSGD, AMAdamW  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
REL = 1e-6


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"data file {path} not found (see ../shared/data/README.md)")
    return path


# --------------------------------------------------------------------------- mushrooms


@pytest.fixture(scope="module")
def mushrooms():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    X, y = sklearn_datasets.load_svmlight_file(
        str(_require(DATA / "libsvm" / "mushrooms")), n_features=112
    )
    X = torch.tensor(X.toarray(), dtype=torch.float64)
    y = torch.tensor(y == 2, dtype=torch.float64)  # labels {1, 2} -> {0, 1}
    return X, y


def _logreg_run(X, y, make_opt, n_steps=150, batch=64, l2=1e-4):
    torch.manual_seed(0)
    model = torch.nn.Linear(X.shape[1], 1).double()
    opt = make_opt(model.parameters())
    rng = np.random.default_rng(0)

    def full_loss():
        with torch.no_grad():
            logits = model(X).squeeze(1)
            return float(torch.nn.functional.binary_cross_entropy_with_logits(logits, y))

    initial = full_loss()
    betas = []
    for _ in range(n_steps):
        idx = torch.from_numpy(rng.choice(X.shape[0], size=batch, replace=False))
        opt.zero_grad()
        logits = model(X[idx]).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y[idx])
        loss = loss + 0.5 * l2 * model.weight.pow(2).sum()
        loss.backward()
        opt.step()
        betas.append(float(opt.latest_betas()[0][0]))
    with torch.no_grad():
        accuracy = float(((model(X).squeeze(1) > 0).double() == y).double().mean())
    return initial, full_loss(), accuracy, np.array(betas)


# measured with this code (seeded, float64)
MUSHROOMS_EXPECTED = {
    "AMSGD": {
        "initial": 0.761946192839084,
        "final": 0.07056986597850318,
        "accuracy": 0.982767109798129,
    },
    "AMAdamW": {
        "initial": 0.761946192839084,
        "final": 0.08168509970658953,
        "accuracy": 0.9855982274741507,
    },
}

MUSHROOMS_OPTIMIZERS = {
    "AMSGD": lambda params: AMSGD(params, lr=0.5, lam=0.1, beta_max=0.9),
    "AMAdamW": lambda params: AMAdamW(params, lr=1e-2, weight_decay=1e-2),
}


@pytest.mark.parametrize("name", list(MUSHROOMS_OPTIMIZERS))
def test_mushrooms_logistic_regression(mushrooms, name):
    X, y = mushrooms
    initial, final, accuracy, betas = _logreg_run(X, y, MUSHROOMS_OPTIMIZERS[name])
    expected = MUSHROOMS_EXPECTED[name]
    assert final < 0.25 * initial
    assert initial == pytest.approx(expected["initial"], rel=REL)
    assert final == pytest.approx(expected["final"], rel=REL)
    assert accuracy == pytest.approx(expected["accuracy"], abs=3 / X.shape[0])  # 3 samples
    assert np.all((betas >= 0) & (betas <= 0.9)) and np.any((betas > 0.05) & (betas < 0.85))


# --------------------------------------------------------------------------- Fashion-MNIST


def _idx(path: Path, offset: int) -> np.ndarray:
    with gzip.open(_require(path), "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


@pytest.fixture(scope="module")
def fashion():
    root = DATA / "fashion-mnist"
    images = _idx(root / "t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784)[:3000]
    labels = _idx(root / "t10k-labels-idx1-ubyte.gz", 8)[:3000]
    X = torch.tensor(images, dtype=torch.float64) / 255.0
    y = torch.tensor(labels, dtype=torch.int64)
    return (X[:2000], y[:2000]), (X[2000:], y[2000:])


def _mlp_run(train, test, make_opt, n_steps=150, batch=64):
    (X, y), (Xt, yt) = train, test
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    ).double()
    opt = make_opt(model.parameters())
    rng = np.random.default_rng(1)

    def loss_on(A, b):
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(model(A), b))

    initial = loss_on(X, y)
    betas = []
    for _ in range(n_steps):
        idx = torch.from_numpy(rng.choice(X.shape[0], size=batch, replace=False))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X[idx]), y[idx]).backward()
        opt.step()
        betas.append([float(b) for b in opt.latest_betas()[0]])
    with torch.no_grad():
        accuracy = float((model(Xt).argmax(1) == yt).double().mean())
    return initial, loss_on(X, y), accuracy, np.array(betas)


FASHION_EXPECTED = {
    "AMSGD": {"initial": 2.3188581048322323, "final": 0.6519755371516561, "accuracy": 0.761},
    "AMAdamW": {"initial": 2.3188581048322323, "final": 0.5772501173307055, "accuracy": 0.787},
}

FASHION_OPTIMIZERS = {
    "AMSGD": lambda params: AMSGD(params, lr=0.1),
    "AMAdamW": lambda params: AMAdamW(params, lr=1e-3),
}


@pytest.mark.parametrize("name", list(FASHION_OPTIMIZERS))
def test_fashion_mnist_mlp(fashion, name):
    train, test = fashion
    initial, final, accuracy, betas = _mlp_run(train, test, FASHION_OPTIMIZERS[name])
    expected = FASHION_EXPECTED[name]
    assert final < 0.5 * initial
    assert accuracy > 0.7
    assert initial == pytest.approx(expected["initial"], rel=REL)
    assert final == pytest.approx(expected["final"], rel=REL)
    assert accuracy == pytest.approx(expected["accuracy"], abs=3 / len(test[1]))  # 3 samples
    # one beta per step (AMSGD, global) or per tensor (AMAdamW, per layer), in [0, 0.9]
    assert betas.shape == (150, 4)
    assert np.all(betas == betas[:, :1]) if name == "AMSGD" else np.any(betas != betas[:, :1])
    assert np.all((betas >= 0) & (betas <= 0.9)) and np.any((betas > 0.05) & (betas < 0.85))
