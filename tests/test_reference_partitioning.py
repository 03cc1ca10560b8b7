"""t5lite's logical axis rules against T5X's `standard_logical_axis_rules`.

`t5x_standard_logical_axis_rules` transcribes google-research/t5x, t5x/partitioning.py,
`standard_logical_axis_rules` (T5X's mesh is ('data', 'model')). Each of t5lite's shipped meshes
(gin/partitioning/*.gin) is compared with the T5X setting it stands for: every logical spec of
the models' parameters and of the activations they constrain is resolved by flax under both rule
tables, t5lite's mesh axes of size 1 dropped and the rest named as T5X names them.
"""
import functools

import flax.linen as nn
import jax
import pytest
from jax.sharding import PartitionSpec as P

from t5lite.models import build, get_config
from t5lite.models.peft import PrefixTuning
from t5lite.train.partitioning import DEFAULT_RULES


def t5x_standard_logical_axis_rules(activation_partitioning_dims=1, parameter_partitioning_dims=1,
                                    additional_rules=None):
    """google-research/t5x t5x/partitioning.py, standard_logical_axis_rules (logging left out)."""
    if activation_partitioning_dims == 1 and parameter_partitioning_dims == 1:
        rules = [
            ('batch', 'data'),
            ('vocab', 'model'),
            ('embed', None),
            ('mlp', 'model'),
            ('heads', 'model'),
            ('kv', None),
            ('joined_kv', 'model'),  # joined heads+kv dim in 2D attn param layouts
            ('relpos_buckets', None),
            ('abspos_buckets', None),
            ('length', None),
            ('layers', None),
            ('stack', None),
            ('mlp_activations', None),
        ]
    elif activation_partitioning_dims == 2 and parameter_partitioning_dims == 1:
        rules = [
            ('batch', 'data'),
            ('vocab', 'model'),
            ('mlp', 'model'),
            ('heads', 'model'),
            ('kv', None),
            ('joined_kv', 'model'),
            ('embed', 'model'),
            ('relpos_buckets', None),
            ('abspos_buckets', None),
            ('length', None),
            ('layers', None),
            ('stack', None),
            ('mlp_activations', None),
        ]
    elif activation_partitioning_dims == 1 and parameter_partitioning_dims == 2:
        rules = [
            ('batch', 'data'),
            ('vocab', 'model'),
            ('mlp', 'model'),
            ('heads', 'model'),
            ('kv', None),
            ('joined_kv', 'model'),
            ('embed', 'data'),
            ('relpos_buckets', None),
            ('abspos_buckets', None),
            ('length', None),
            ('layers', None),
            ('stack', None),
            ('mlp_activations', None),
        ]
    elif activation_partitioning_dims == 2 and parameter_partitioning_dims == 2:
        rules = [
            ('batch', 'data'),
            ('vocab', 'model'),
            ('mlp', 'model'),
            ('heads', 'model'),
            ('kv', None),
            ('joined_kv', 'model'),
            ('embed', 'model'),
            ('embed', 'data'),
            ('relpos_buckets', None),
            ('abspos_buckets', None),
            ('length', None),
            ('layers', None),
            ('stack', None),
            ('mlp_activations', None),
        ]
    else:
        raise ValueError(
            f'`activation_partitioning_dims` = {activation_partitioning_dims} '
            f'`parameter_partitioning_dims` = {parameter_partitioning_dims} '
            'is not supported.')

    if additional_rules:
        rules.extend(additional_rules)

    return rules


# The activations t5lite's layers constrain (t5lite/models/layers.py, transformer.py).
ACTIVATION_SPECS = [("batch", "length", "embed"), ("batch", "length", "mlp"), ("batch", "length", "heads", "kv"),
                    ("batch", "heads", "length", "kv"), ("batch", "length", "vocab"), ("batch", "length")]


@functools.cache
def _parameter_specs(preset):
    cfg = get_config(preset)
    tokens = jax.numpy.ones((1, 8), jax.numpy.int32)
    inputs = {"encoder": dict(encoder_input_tokens=tokens), "decoder": dict(decoder_input_tokens=tokens),
              "encoder_decoder": dict(encoder_input_tokens=tokens, decoder_input_tokens=tokens)}[cfg.arch]
    boxed = jax.eval_shape(lambda: build(cfg).init(jax.random.key(0), **inputs))
    specs = jax.tree.leaves(nn.get_partition_spec(boxed), is_leaf=lambda x: isinstance(x, P))
    for projection in (False, True):   # prefix tuning's encoders (t5lite.models.peft)
        prefix_specs = PrefixTuning(prefix_projection=projection)._prefix_encoder(jax.random.key(0), 64, cfg)[1]
        specs += jax.tree.leaves(prefix_specs, is_leaf=lambda x: isinstance(x, P))
    return frozenset(tuple(spec) for spec in specs)


def _t5lite_as_t5x(logical, mesh_shape, t5x_names):
    """t5lite's mesh axes for `logical` under DEFAULT_RULES, without the size-1 axes of
    `mesh_shape` (data, fsdp, model), each named as T5X names the mesh axis that plays its part."""
    sizes = dict(zip(("data", "fsdp", "model"), mesh_shape))
    out = []
    for axes in nn.logical_to_mesh_axes(logical, DEFAULT_RULES):
        axes = [a for a in ((axes,) if isinstance(axes, str) else axes or ()) if sizes[a] > 1]
        assert len(axes) <= 1, (logical, axes)
        out.append(t5x_names[axes[0]] if axes else None)
    return tuple(out)


# (gin file, its mesh with every used axis > 1, T5X's (activation, parameter) partitioning dims,
# which T5X mesh axis each used t5lite axis plays)
SHIPPED_MESHES = [("data_parallel.gin", (8, 1, 1), (1, 1), {"data": "data"}),
                  ("fsdp.gin", (1, 8, 1), (1, 2), {"fsdp": "data"}),
                  ("tensor_parallel.gin", (4, 1, 2), (1, 1), {"data": "data", "model": "model"}),
                  ("fsdp + tensor parallel", (1, 4, 2), (1, 2), {"fsdp": "data", "model": "model"})]


@pytest.mark.parametrize("preset", ["t5_tiny", "t5_1_1_tiny", "bart_tiny", "gpt2_tiny", "bert_tiny", "albert_tiny"])
@pytest.mark.parametrize("name,mesh_shape,dims,t5x_names", SHIPPED_MESHES, ids=[m[0] for m in SHIPPED_MESHES])
def test_shipped_meshes_shard_like_t5xs_standard_rules(preset, name, mesh_shape, dims, t5x_names):
    t5x_rules = t5x_standard_logical_axis_rules(*dims)
    t5x_axes = {n for n, _ in t5x_rules}
    checked = 0
    for logical in sorted(_parameter_specs(preset) | set(ACTIVATION_SPECS), key=str):
        if not set(logical) <= t5x_axes:   # t5lite's own axes (LoRA, prompts, adapters): T5X has none
            continue
        used = set(t5x_names.values())   # T5X's mesh axes of size > 1 on the same devices
        expected = tuple(a if a in used else None for a in nn.logical_to_mesh_axes(logical, t5x_rules))
        assert _t5lite_as_t5x(logical, mesh_shape, t5x_names) == expected, (name, logical)
        checked += 1
    assert checked >= 8
