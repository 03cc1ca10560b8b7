"""The linear probe: softmax regression on frozen features, trained to convergence with L-BFGS on
the whole set (the objective is convex, so the probe is a function of the features alone, not of
an optimiser schedule). Objective: mean cross-entropy + l2 / 2 * ||W||^2 (bias unpenalised), which
is scikit-learn's LogisticRegression with C = 1 / (l2 * examples).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax


def objective(params, x, y, l2: float):
    logits = x @ params["w"] + params["b"]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return ce + 0.5 * l2 * jnp.sum(params["w"] ** 2)


@jax.jit
def _fit(x, y, params, l2, max_iter, tol):
    fun = lambda p: objective(p, x, y, l2)
    solver = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(fun)

    def body(carry):
        p, state = carry
        value, grad = value_and_grad(p, state=state)
        updates, state = solver.update(grad, state, p, value=value, grad=grad, value_fn=fun)
        return optax.apply_updates(p, updates), state

    def running(carry):
        _, state = carry
        count = optax.tree_utils.tree_get(state, "count")
        grad = optax.tree_utils.tree_get(state, "grad")
        return (count == 0) | ((count < max_iter) & (optax.tree_utils.tree_l2_norm(grad) >= tol))

    params, _ = jax.lax.while_loop(running, body, (params, solver.init(params)))
    return params


def fit(x: np.ndarray, y: np.ndarray, num_classes: int, l2: float = 1e-3, max_iter: int = 500,
        tol: float = 1e-5) -> dict:
    """{"w": [d, classes], "b": [classes]} minimising `objective` on features x [n, d], labels y [n]."""
    params = {"w": jnp.zeros((x.shape[1], num_classes), jnp.float32), "b": jnp.zeros(num_classes, jnp.float32)}
    params = _fit(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32), params, l2, max_iter, tol)
    return jax.tree.map(np.asarray, params)


def predict_proba(params: dict, x: np.ndarray) -> np.ndarray:
    return np.asarray(jax.nn.softmax(jnp.asarray(x, jnp.float32) @ params["w"] + params["b"]))
