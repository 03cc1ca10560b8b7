"""Bottleneck adapters inside a Transformer layer's residual sublayers, as the `adapters` package
(1.3) computes them; `t5lite.models.peft.Adapters` creates their params and trains them.

A layer applies an adapter wherever its params hold one, so evaluation, inference and decoding
need nothing but the params: `<layer>/<config>/<sublayer>/{down,up}/{kernel,bias}`, with
<config> "houlsby" (adapters' "double_seq_bn") or "pfeiffer" ("seq_bn") and <sublayer>
`self_attention`, `cross_attention` or `mlp`. The adapter is A(z) = up(act(down(z))); with h the
sublayer's output (after dropout), x its residual input and LN the post-norm layer norm (none for
pre-norm models, T5 and GPT-2):

    houlsby  (swish; original_ln_before False):  LN(x + h + A(h))
    pfeiffer (relu;  original_ln_before True):   LN(x + h + A(LN(x + h)))   (the same, pre-trained LN twice)

(adapters' residual_before_ln True, original_ln_after True, no adapter layer norms.)
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

# config -> (activation, whether the adapter reads the normed residual sum instead of h)
CONFIGS = {"houlsby": (nn.silu, False), "pfeiffer": (nn.relu, True)}


def residual_add(module: nn.Module, name: str, x, h, norm=None, dtype=jnp.float32):
    """`x + h`, then `norm` (post-norm), for the sublayer `name` of the layer `module` — with its
    bottleneck adapter in between when `module`'s params hold one."""
    for config, (act, reads_sum) in CONFIGS.items():
        adapters = module.get_variable("params", config) if module.has_variable("params", config) else {}
        if name in adapters:
            p = jax.tree.map(lambda v: v.astype(dtype), adapters[name])
            z = (x + h if norm is None else norm(x + h)) if reads_sum else h
            down = act(jnp.dot(z.astype(dtype), p["down"]["kernel"]) + p["down"]["bias"])
            h = h + jnp.dot(down, p["up"]["kernel"]) + p["up"]["bias"]
            break
    return x + h if norm is None else norm(x + h)

