"""AdamW's weight-decay mask against what Hugging Face's Trainer decays in the same BERT and GPT-2."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_variables
from jax.sharding import PartitionSpec as P

from t5lite import models
from t5lite.interop import hf
from t5lite.train import optimizers

torch = pytest.importorskip("torch", reason="the reference is PyTorch transformers (the hf extra)")
transformers = pytest.importorskip("transformers", reason="the reference is PyTorch transformers (the hf extra)")


def hugging_face_decayed(model, decay_embeddings):
    """Element counts (decayed, all) by HF Trainer's rule; without embeddings as minGPT does."""
    from transformers.trainer_pt_utils import get_parameter_names
    patterns = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
    if decay_embeddings:
        names = set(transformers.Trainer.get_decay_parameter_names(None, model))
    else:
        names = set(get_parameter_names(model, [torch.nn.LayerNorm, torch.nn.Embedding], patterns))
    params = dict(model.named_parameters())
    return sum(p.numel() for n, p in params.items() if n in names), sum(p.numel() for p in params.values())


@pytest.mark.parametrize("decay_embeddings", [True, False])
@pytest.mark.parametrize("preset, hf_class", [("bert_tiny", "BertForPreTraining"), ("gpt2_tiny", "GPT2LMHeadModel")])
def test_weight_decay_mask_matches_hugging_face(tmp_path, preset, hf_class, decay_embeddings):
    module = models.build(preset)
    variables = random_variables(module)
    hf.save(module, variables, str(tmp_path))
    decayed, total = hugging_face_decayed(getattr(transformers, hf_class).from_pretrained(str(tmp_path)),
                                          decay_embeddings)
    specs = nn.get_partition_spec(variables)["params"]
    mask = optimizers.weight_decay_mask(specs, decay_embeddings)
    sizes = jax.tree.map(lambda x: x.size, nn.unbox(variables)["params"])
    ours = sum(s for s, m in zip(jax.tree.leaves(sizes), jax.tree.leaves(mask)) if m)
    assert sum(jax.tree.leaves(sizes)) == total and ours == decayed


def test_adamw_decays_only_the_masked_params():
    specs = {"dense": {"kernel": P("embed", "mlp"), "bias": P("mlp")}, "norm": {"scale": P("embed")},
             "token_embedder": {"embedding": P("vocab", "embed")}}
    params = jax.tree.map(lambda s: jnp.ones((3,) * len(s)), specs, is_leaf=lambda x: isinstance(x, P))
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    for decay_embeddings, moved in [(True, {"kernel", "embedding"}), (False, {"kernel"})]:
        tx = optimizers.adamw(optimizers.constant(0.1), weight_decay=0.5, decay_embeddings=decay_embeddings)(specs)
        updates, _ = tx.update(zero_grads, tx.init(params), params)
        changed = {path[-1].key for path, u in jax.tree_util.tree_leaves_with_path(updates) if np.any(u != 0)}
        assert changed == moved
