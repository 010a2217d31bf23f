"""FiniteSum objectives in ``amopt.minimize``: batch sizes, and ``jac``/``args``."""

import warnings

import numpy as np
import pytest
from scipy.optimize import OptimizeWarning

import amopt


class Mean:
    """f(x) = 1/(2n) sum_i (x - a_i)^2, minimised at the mean of a (the class docstring's)."""

    def __init__(self, a):
        self.a = np.asarray(a, dtype=np.float64)
        self.n_samples = self.a.size
        self.batches = []

    def value_and_grad(self, x):
        r = x - self.a
        return 0.5 * float(np.mean(r**2)), np.array([np.mean(r)])

    def batch_value_and_grad(self, x, indices):
        self.batches.append(np.array(indices))
        r = x - self.a[indices]
        return 0.5 * float(np.mean(r**2)), np.array([np.mean(r)])

    def grad(self, x):
        return self.value_and_grad(x)[1]


@pytest.mark.parametrize("method", ["sgd", "msgd", "am-sgd"])
@pytest.mark.parametrize("n", [1, 3, 31])
def test_default_batch_size_is_capped_by_the_number_of_samples(method, n):
    a = np.linspace(-1.0, 5.0, n)
    fs = Mean(a)
    res = amopt.minimize(fs, np.zeros(1), method=method, options={"lr": 0.5, "maxiter": 1000})
    assert res.status == 1  # ran its maxiter steps
    # every batch is the whole (reshuffled) data set: the full gradient each step
    assert all(np.array_equal(np.sort(b), np.arange(n)) for b in fs.batches)
    np.testing.assert_allclose(res.x, [np.mean(a)], rtol=0, atol=1e-10 * max(1.0, np.abs(a).max()))


def test_default_batch_size_is_32_for_larger_sets():
    fs = Mean(np.arange(100.0))
    amopt.minimize(fs, np.zeros(1), method="sgd", options={"maxiter": 4, "seed": 0})
    assert [b.size for b in fs.batches] == [32, 32, 32, 4]


def test_batch_size_above_n_samples_without_replacement_is_an_error():
    with pytest.raises(
        ValueError,
        match=r"batch_size must be an integer in \[1, 3\]; got batch_size=4: without "
        r"replacement a mini-batch holds at most fun.n_samples = 3 samples",
    ):
        amopt.minimize(
            Mean([1.0, 2.0, 6.0]), np.zeros(1), method="am-sgd", options={"batch_size": 4}
        )
    with pytest.raises(
        ValueError, match=r"batch_size must be an integer in \[1, 3\]; got batch_size=5"
    ):
        amopt.minimize(
            Mean([1.0, 2.0, 6.0]), np.zeros(1), method="adam", options={"batch_size": 5}
        )


def test_batch_size_above_n_samples_with_replacement_samples_iid():
    fs = Mean([1.0, 2.0, 6.0])
    amopt.minimize(
        fs,
        np.zeros(1),
        method="sgd",
        options={"batch_size": 5, "replace": True, "seed": 0, "maxiter": 40},
    )
    batches = np.stack(fs.batches)
    assert batches.shape == (40, 5)
    assert set(np.unique(batches)) == {0, 1, 2}


@pytest.mark.parametrize("bad", [0, -1])
def test_batch_size_must_be_positive(bad):
    with pytest.raises(
        ValueError, match=rf"batch_size must be an integer >= 1; got batch_size={bad}"
    ):
        amopt.minimize(Mean([1.0, 2.0]), np.zeros(1), method="sgd", options={"batch_size": bad})


def test_args_with_a_finite_sum_are_an_error():
    with pytest.raises(ValueError, match=r"args=\(2.0,\) cannot be used with a FiniteSum fun"):
        amopt.minimize(Mean([1.0, 2.0]), np.zeros(1), method="sgd", args=(2.0,))


def test_a_foreign_jac_with_a_finite_sum_warns_and_is_not_used():
    fs = Mean([1.0, 2.0, 6.0])
    opts = {"lr": 0.5, "maxiter": 20, "seed": 1}
    ref = amopt.minimize(fs, np.zeros(1), method="am-sgd", options=opts)
    with pytest.warns(OptimizeWarning, match=r"jac=.* is ignored: with a FiniteSum fun"):
        res = amopt.minimize(
            fs, np.zeros(1), method="am-sgd", jac=lambda x: np.zeros(1), options=opts
        )
    np.testing.assert_array_equal(res.x, ref.x)


@pytest.mark.parametrize("jac", [None, True, "own method"])
def test_jac_of_the_object_itself_is_accepted_silently(jac):
    fs = Mean([1.0, 2.0, 6.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = amopt.minimize(
            fs,
            np.zeros(1),
            method="gd",
            jac=fs.grad if jac == "own method" else jac,
            options={"lr": 1.0, "gtol": 1e-12},
        )
    np.testing.assert_allclose(res.x, [3.0], rtol=1e-12)


def test_seed_with_full_batch_adam_on_a_finite_sum_warns():
    with pytest.warns(OptimizeWarning, match="seed is ignored"):
        amopt.minimize(
            Mean([1.0, 2.0]), np.zeros(1), method="adam", options={"seed": 0, "maxiter": 2}
        )
