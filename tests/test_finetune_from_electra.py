"""Fine-tuning an ELECTRA run grafts its discriminator (ELECTRA fine-tunes the discriminator; the
generator is thrown away): the head model's backbone holds exactly the checkpoint's discriminator
params (but the replaced-token head), and the classifier head starts fresh."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from conftest import train_tiny

from t5lite import models
from t5lite.infer import checkpoint_reader
from t5lite.objectives import electra
from t5lite.objectives.finetune import ClassificationObjective


def test_a_classifier_starts_from_the_electra_runs_discriminator(tmp_path):
    config = models.get_config("electra_tiny", vocab_size=2176, dropout_rate=0.0)
    pretraining = electra.ElectraObjective("electra_tiny_generator")
    run = tmp_path / "electra"
    train_tiny(run, config, 2, mixture_or_task_name="embedded_docs_electra_mlm", task_feature_lengths={"inputs": 32},
               feature_converter="encoder", objective=pretraining, z_loss=0.0)
    joint = pretraining.build_model(config)
    init = lambda: nn.unbox(joint.init(jax.random.key(0), encoder_input_tokens=jnp.ones((1, 8), jnp.int32)))["params"]
    stored = checkpoint_reader.restore_params(str(run), jax.eval_shape(init))   # the whole ELECTRA tree

    finetuning = ClassificationObjective(num_labels=3, pooling="first")   # ELECTRA has no pooler
    classifier = finetuning.build_model(config)
    abstract = jax.eval_shape(lambda: nn.unbox(classifier.init(
        jax.random.key(0), **finetuning.init_features({"encoder_input_tokens": 8, "token_type_ids": 8})))["params"])
    grafted = finetuning.initial_params(str(run), abstract)
    assert grafted["head"] is None
    want = dict(jax.tree.leaves_with_path(stored["discriminator"]))
    got = dict(jax.tree.leaves_with_path(grafted["backbone"]))
    # everything but the replaced-token head, which the classifier does not use
    assert {jax.tree_util.keystr(p) for p in set(want) - set(got)} == {
        jax.tree_util.keystr(p) for p in want if "discriminator_head" in jax.tree_util.keystr(p)}
    for path, value in got.items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(want[path]), err_msg=jax.tree_util.keystr(path))
