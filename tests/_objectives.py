"""Small objectives written once over the array API, used by the minimize tests.

They are deliberately independent of ``amopt.problems`` so that the
oracle-agreement tests do not depend on the problems module.
"""

import numpy as np

#: A small diagonal quadratic ``f(x) = 1/2 x^T A x - b^T x`` with its gradient and
#: minimiser, for the tests of minimize's interface.
DIAG_A = np.diag([1.0, 4.0, 10.0])
DIAG_B = np.array([1.0, -2.0, 0.5])
DIAG_X_STAR = np.linalg.solve(DIAG_A, DIAG_B)


def diag_f(x):
    return 0.5 * x @ DIAG_A @ x - DIAG_B @ x


def diag_g(x):
    return DIAG_A @ x - DIAG_B


def quadratic_data(n=12, cond=50.0, seed=0):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = q @ np.diag(np.geomspace(1.0, cond, n)) @ q.T
    b = rng.standard_normal(n)
    return A, b


def logreg_data(n=60, p=8, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    w_true = rng.standard_normal(p)
    y = np.where(X @ w_true + 0.5 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y


class Quadratic:
    """f(x) = 1/2 x^T A x - b^T x on a flat vector or a [matrix, vector] split of it."""

    def __init__(self, xp, A, b, split=None):
        self.xp, self.split = xp, split
        self.A, self.b = xp.asarray(A), xp.asarray(b)
        self.L = float(np.linalg.eigvalsh(A)[-1])

    def _flat(self, x):
        xp = self.xp
        if not self.split:
            return x
        return xp.concat([xp.reshape(a, (-1,)) for a in x])

    def _unflat(self, z, like):
        xp = self.xp
        if not self.split:
            return z
        out, start = [], 0
        for a in like:
            size = int(np.prod(a.shape))
            out.append(xp.reshape(z[start : start + size], a.shape))
            start += size
        return type(like)(out)

    def __call__(self, x):
        xp = self.xp
        z = self._flat(x)
        A, b = xp.astype(self.A, z.dtype), xp.astype(self.b, z.dtype)
        return 0.5 * xp.sum(z * (A @ z)) - xp.sum(b * z)

    def grad(self, x):
        xp = self.xp
        z = self._flat(x)
        A, b = xp.astype(self.A, z.dtype), xp.astype(self.b, z.dtype)
        return self._unflat(A @ z - b, x)


class Logistic:
    """Mean logistic loss with parameters [w, bias] (a list) or w (one array); a FiniteSum."""

    def __init__(self, xp, X, y, l2=1e-3, as_list=False):
        self.xp = xp
        self.X, self.y = xp.asarray(X), xp.asarray(y)
        self.l2, self.as_list = l2, as_list
        self.n_samples = X.shape[0]
        self.L = float(np.linalg.eigvalsh(X.T @ X)[-1]) / (4 * X.shape[0]) + l2 + 0.25

    def _parts(self, x):
        return (x[0], x[1]) if self.as_list else (x, None)

    def batch_value_and_grad(self, x, idx):
        xp = self.xp
        w, c = self._parts(x)
        idx = xp.asarray(np.asarray(idx, dtype=np.int64))
        X = xp.astype(xp.take(self.X, idx, axis=0), w.dtype)
        y = xp.astype(xp.take(self.y, idx, axis=0), w.dtype)
        z = X @ w + (0.0 if c is None else c[0])
        m = -y * z
        f = xp.mean(xp.logaddexp(xp.zeros_like(m), m)) + 0.5 * self.l2 * xp.sum(w * w)
        s = -y / (1.0 + xp.exp(-m))  # d loss / d z
        gw = (X.T @ s) / X.shape[0] + self.l2 * w
        if c is None:
            return f, gw
        gc = xp.reshape(xp.mean(s), (1,))
        return f, type(x)([gw, gc])

    def value_and_grad(self, x):
        return self.batch_value_and_grad(x, np.arange(self.n_samples))

    def __call__(self, x):
        return self.value_and_grad(x)[0]

    def grad(self, x):
        return self.value_and_grad(x)[1]
