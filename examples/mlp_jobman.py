"""The documentation's MLP tutorial: a one-hidden-layer perceptron trained by minibatch SGD with
L1/L2 penalties and early stopping, its hyper-parameters read from the state.

In NumPy, on a small data set that needs no download (``dataset``: ``synthetic``, the default;
``digits`` with scikit-learn; or a path to an ``.npz`` file). ``python -m jobman.examples DIR``
copies this module and ``mlp_jobman.conf`` into DIR, where the tutorial runs as written::

    jobman sqlschedule 'sqlite:///mlp.db/mlp_dumi' mlp_jobman.experiment mlp_jobman.conf
    jobman sqlschedules 'sqlite:///mlp.db/mlp_dumi' mlp_jobman.experiment mlp_jobman.conf 'n_hidden={{20,30}}'
    jobman sql -n0 'sqlite:///mlp.db/mlp_dumi' .
    jobman sqlview 'sqlite:///mlp.db/mlp_dumi' dumi_mlp_view
"""

from __future__ import annotations

import time

import numpy as np


def load_data(dataset: str = "synthetic", seed: int = 0):
    """(train, valid, test) pairs of inputs and labels: a fixed shuffle, split 60/20/20."""
    from jobman.models.datasets import load

    data = (
        load(dataset, n_samples=1500, n_features=20, n_classes=3, seed=seed)
        if dataset == "synthetic"
        else load(dataset)
    )
    X, y = np.asarray(data.X, dtype=np.float64), np.asarray(data.y)
    order = np.random.default_rng(seed).permutation(len(X))
    X, y = X[order], y[order]
    a, b = int(0.6 * len(X)), int(0.8 * len(X))
    return (X[:a], y[:a]), (X[a:b], y[a:b]), (X[b:], y[b:])


class MLP:
    """``softmax(W2 · tanh(W1 · x + b1) + b2)``, with its L1 norm and squared L2 norm."""

    def __init__(self, n_in: int, n_hidden: int, n_out: int, rng: np.random.Generator) -> None:
        bound1, bound2 = np.sqrt(6.0 / (n_in + n_hidden)), np.sqrt(6.0 / (n_hidden + n_out))
        self.W1 = rng.uniform(-bound1, bound1, (n_in, n_hidden))
        self.b1 = np.zeros(n_hidden)
        self.W2 = rng.uniform(-bound2, bound2, (n_hidden, n_out))
        self.b2 = np.zeros(n_out)

    def forward(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        hidden = np.tanh(X @ self.W1 + self.b1)
        logits = hidden @ self.W2 + self.b2
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        return hidden, p / p.sum(axis=1, keepdims=True)

    def errors(self, X: np.ndarray, y: np.ndarray) -> float:
        """The fraction of examples misclassified."""
        return float(np.mean(self.forward(X)[1].argmax(axis=1) != y))

    def sgd_step(self, X: np.ndarray, y: np.ndarray, lr: float, L1_reg: float, L2_reg: float) -> float:
        """One step on the minibatch: the mean negative log-likelihood plus the penalties; the cost."""
        hidden, p = self.forward(X)
        n = len(X)
        cost = -np.mean(np.log(p[np.arange(n), y] + 1e-12))
        cost += L1_reg * (np.abs(self.W1).sum() + np.abs(self.W2).sum())
        cost += L2_reg * ((self.W1**2).sum() + (self.W2**2).sum())
        d_logits = p.copy()
        d_logits[np.arange(n), y] -= 1
        d_logits /= n
        d_hidden = (d_logits @ self.W2.T) * (1 - hidden**2)
        gW2 = hidden.T @ d_logits + L1_reg * np.sign(self.W2) + 2 * L2_reg * self.W2
        gW1 = X.T @ d_hidden + L1_reg * np.sign(self.W1) + 2 * L2_reg * self.W1
        self.W2 -= lr * gW2
        self.b2 -= lr * d_logits.sum(axis=0)
        self.W1 -= lr * gW1
        self.b1 -= lr * d_hidden.sum(axis=0)
        return float(cost)


def sgd_optimization(
    learning_rate=0.01, n_hidden=500, L1_reg=0.00, L2_reg=0.0001, batch_size=20, n_iter=100, dataset="synthetic", seed=0
):
    """Train for at most ``n_iter`` epochs, validating once per epoch and stopping when patience runs out.

    Returns (best validation error, test error at that point, minutes trained, iteration of the best).
    """
    (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = load_data(dataset, seed)
    rng = np.random.default_rng(seed)
    model = MLP(train_x.shape[1], int(n_hidden), int(max(train_y.max(), valid_y.max(), test_y.max()) + 1), rng)
    n_batches = max(1, len(train_x) // int(batch_size))
    patience, patience_increase, improvement_threshold = 10 * n_batches, 2, 0.995
    best_validation_loss, best_iter, test_score = float("inf"), 0, 0.0
    start = time.perf_counter()
    for iteration in range(int(n_iter) * n_batches):
        batch = iteration % n_batches
        lo, hi = batch * int(batch_size), (batch + 1) * int(batch_size)
        model.sgd_step(train_x[lo:hi], train_y[lo:hi], float(learning_rate), float(L1_reg), float(L2_reg))
        if (iteration + 1) % n_batches == 0:  # once per epoch
            this_validation_loss = model.errors(valid_x, valid_y)
            print(f"epoch {iteration // n_batches}, validation error {this_validation_loss * 100:f} %")
            if this_validation_loss < best_validation_loss:
                if this_validation_loss < best_validation_loss * improvement_threshold:
                    patience = max(patience, iteration * patience_increase)
                best_validation_loss, best_iter = this_validation_loss, iteration
                test_score = model.errors(test_x, test_y)
        if patience <= iteration:
            break
    minutes = (time.perf_counter() - start) / 60.0
    print(
        f"Optimization complete with best validation score of {best_validation_loss * 100:f} %, "
        f"with test performance {test_score * 100:f} %"
    )
    return best_validation_loss, test_score, minutes, best_iter


def experiment(state, channel):
    """The tutorial's experiment: hyper-parameters from the state, results back into it."""
    (best_validation_loss, test_score, minutes_trained, iter) = sgd_optimization(
        state.learning_rate,
        state.n_hidden,
        state.L1_reg,
        state.L2_reg,
        state.batch_size,
        state.n_iter,
        state.get("dataset", "synthetic"),
        state.get("seed", 0),
    )
    state.best_validation_loss = best_validation_loss
    state.test_score = test_score
    state.minutes_trained = minutes_trained
    state.iter = iter
    return channel.COMPLETE
