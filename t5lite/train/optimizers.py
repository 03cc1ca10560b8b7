"""Optimizers and learning-rate schedules, built on optax, with T5X's defaults."""
from __future__ import annotations

import gin
import jax.numpy as jnp
import optax


@gin.configurable
def rsqrt_decay(base_learning_rate: float = 1.0, warmup_steps: int = 10_000) -> optax.Schedule:
    """T5's schedule: base / sqrt(max(step, warmup)) — constant 0.01 for the first 10k steps."""
    def schedule(step):
        return base_learning_rate / jnp.sqrt(jnp.maximum(step, warmup_steps).astype(jnp.float32))
    return schedule


@gin.configurable
def constant(learning_rate: float = 1e-3) -> optax.Schedule:
    """T5's fine-tuning schedule."""
    return optax.constant_schedule(learning_rate)


@gin.configurable
def warmup_cosine(peak_learning_rate: float = 3e-4, warmup_steps: int = 1000, decay_steps: int = 100_000,
                  end_fraction: float = 0.1) -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(0.0, peak_learning_rate, warmup_steps, max(decay_steps, warmup_steps + 1),
                                              peak_learning_rate * end_fraction)


@gin.configurable
def adafactor(schedule: optax.Schedule = gin.REQUIRED, decay_rate: float = 0.8, clipping_threshold: float = 1.0,
              min_dim_size_to_factor: int = 128, multiply_by_parameter_scale: bool = True,
              epsilon1: float = 1e-30) -> optax.GradientTransformation:
    """T5X's Adafactor: factored second moments, parameter-scaled updates, no momentum.

    optax's `scale_by_param_block_rms` floors the parameter scale at 1e-3 (T5X's epsilon2).
    """
    return optax.adafactor(learning_rate=schedule, min_dim_size_to_factor=min_dim_size_to_factor,
                           decay_rate=decay_rate, multiply_by_parameter_scale=multiply_by_parameter_scale,
                           clipping_threshold=clipping_threshold, momentum=None, eps=epsilon1, factored=True)


@gin.configurable
def adamw(schedule: optax.Schedule = gin.REQUIRED, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 0.01, max_grad_norm: float | None = 1.0) -> optax.GradientTransformation:
    """AdamW with global-norm gradient clipping (the BERT/GPT recipe)."""
    chain = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm else []
    chain.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
    return optax.chain(*chain)


@gin.configurable
def optimizer_and_schedule(optimizer=gin.REQUIRED, schedule=gin.REQUIRED):
    """Pairs an optimizer factory with a schedule so the trainer can log the learning rate."""
    return optimizer(schedule=schedule), schedule
