"""Task heads on t5lite backbones: shapes, masking and what each head reads."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite import models
from t5lite.models import heads as H
from t5lite.models import layers as L
from conftest import assert_close
from t5lite.models.with_head import WithHead


def random_variables(module, seed=0, scale=0.2, **features):
    features = features or dict(encoder_input_tokens=jnp.zeros((1, 4), jnp.int32),
                                decoder_input_tokens=jnp.zeros((1, 4), jnp.int32))
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), **features))
    rng = np.random.RandomState(seed)
    return jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, scale, s.shape), s.dtype), shapes)


def ids(shape, seed=0, pad=0, lengths=None):
    out = np.random.RandomState(seed).randint(3, 900, shape)
    for row, n in enumerate(lengths or []):
        out[row, n:] = pad
    return jnp.asarray(out)


BERT = models.get_config("bert_tiny")
GPT2 = models.get_config("gpt2_tiny")


@pytest.mark.parametrize("num_labels, pooling", [(3, "pooler"), (1, "pooler"), (2, "first"), (2, "mean")])
def test_sequence_classification_and_regression(num_labels, pooling):
    model = WithHead(BERT, H.SequenceClassificationHead(BERT, num_labels), pooling)
    tokens = ids((2, 7), lengths=(7, 4))
    variables = random_variables(model, encoder_input_tokens=tokens)
    assert set(variables["params"]) == {"backbone", "head"}
    out = jax.jit(model.apply)(variables, encoder_input_tokens=tokens)
    assert out.shape == (2, num_labels) and out.dtype == jnp.float32


def test_gpt_classifier_reads_the_last_non_padding_token():
    model = WithHead(GPT2, H.SequenceClassificationHead(GPT2, 2), "last")
    tokens = ids((2, 6), lengths=(6, 3))
    variables = random_variables(model, decoder_input_tokens=tokens)
    apply = jax.jit(model.apply)
    out = apply(variables, decoder_input_tokens=tokens)
    # Row 1 ends at position 2: its logits are those of the 3-token sequence alone.
    alone = apply(variables, decoder_input_tokens=tokens[1:, :3])
    assert_close(out[1], alone[0])


def test_span_extraction_masks_padding():
    model = WithHead(BERT, H.SpanExtractionHead(BERT))
    tokens = ids((2, 8), lengths=(8, 5))
    variables = random_variables(model, encoder_input_tokens=tokens)
    start, end = jax.jit(model.apply)(variables, encoder_input_tokens=tokens)
    assert start.shape == end.shape == (2, 8)
    assert np.all(np.asarray(start)[1, 5:] == L.NEG_INF) and np.all(np.asarray(end)[1, 5:] == L.NEG_INF)
    assert np.all(np.asarray(start)[1, :5] > L.NEG_INF / 2)


def test_token_tagging():
    model = WithHead(BERT, H.TokenTaggingHead(BERT, num_tags=9))
    tokens = ids((2, 8))
    variables = random_variables(model, encoder_input_tokens=tokens)
    assert jax.jit(model.apply)(variables, encoder_input_tokens=tokens).shape == (2, 8, 9)


@pytest.mark.parametrize("name", ["bert_tiny", "albert_tiny"])
def test_nsp_and_sop_heads(name):
    module = models.build(name)
    tokens = ids((3, 8))
    variables = random_variables(module)
    types = jnp.asarray((np.arange(8)[None] >= 4).astype(np.int32).repeat(3, 0))
    logits = jax.jit(module.apply, static_argnames="method")(variables, encoder_input_tokens=tokens,
                                                             token_type_ids=types, method="sentence_logits")
    assert logits.shape == (3, 2)


def test_nsp_head_dropout_is_on_in_training_only():
    """With the same dropout key the encoder's masks are the same, so any difference between the
    head's output and the same pooled vector through a deterministic head is the head's dropout."""
    module = models.build(models.get_config("bert_tiny", dropout_rate=0.5))
    tokens = ids((3, 8))
    variables = random_variables(module)
    rngs = {"dropout": jax.random.PRNGKey(0)}

    def without_head_dropout(m, encoder_input_tokens, enable_dropout):
        return m.sentence_head(m.pool(encoder_input_tokens, enable_dropout=enable_dropout), deterministic=True)
    for training in (True, False):
        ours = module.apply(variables, encoder_input_tokens=tokens, method="sentence_logits",
                            enable_dropout=training, rngs=rngs)
        reference = module.apply(variables, encoder_input_tokens=tokens, method=without_head_dropout,
                                 enable_dropout=training, rngs=rngs)
        assert np.allclose(ours, reference) != training


def test_electra_discriminator_head_scores_every_token():
    module = models.build("electra_tiny")
    tokens = ids((2, 8))
    out = jax.jit(module.apply)(random_variables(module), encoder_input_tokens=tokens)
    assert out.shape == (2, 8) and out.dtype == jnp.float32


class SpanBoundaryProbe(nn.Module):
    """The SBO head with its own (tied) output embedding."""
    config: models.ModelConfig

    @nn.compact
    def __call__(self, hidden, left, right, relative):
        embedder = L.Embed(self.config.vocab_size, self.config.d_model, name="embedder")
        embedder(jnp.zeros((1,), jnp.int32))
        return H.SpanBoundaryHead(self.config, max_pair_targets=4, name="sbo")(hidden, left, right, relative, embedder)


def test_span_boundary_head_reads_only_the_boundaries_and_the_position():
    cfg = BERT
    rng = np.random.RandomState(0)
    hidden = jnp.asarray(rng.normal(size=(2, 12, cfg.d_model)), jnp.float32)
    # Row 0: the three tokens of span 2..4 (boundaries 1 and 5); row 1: span 7..8 and a token of span 1..2.
    left, right = jnp.asarray([[1, 1, 1], [6, 6, 0]]), jnp.asarray([[5, 5, 5], [9, 9, 3]])
    relative = jnp.asarray([[1, 2, 3], [1, 2, 2]])
    probe = SpanBoundaryProbe(cfg)
    variables = probe.init(jax.random.PRNGKey(0), hidden, left, right, relative)
    out = probe.apply(variables, hidden, left, right, relative)
    assert out.shape == (2, 3, cfg.vocab_size)
    inside = hidden.at[0, 3].add(5.0)     # a token inside span 2..4 of row 0
    assert_close(probe.apply(variables, inside, left, right, relative)[0], out[0])
    boundary = hidden.at[0, 5].add(5.0)   # x_{e+1} of that span
    assert np.abs(probe.apply(variables, boundary, left, right, relative)[0] - out[0]).max() > 1e-3
    assert np.abs(out[0, 0] - out[0, 1]).max() > 1e-3   # same boundaries, different positions


def test_pool_helpers():
    hidden = jnp.arange(2 * 3 * 2, dtype=jnp.float32).reshape(2, 3, 2)
    mask = jnp.asarray([[1, 1, 1], [1, 1, 0]])
    np.testing.assert_array_equal(H.pool(hidden, mask, "first"), hidden[:, 0])
    np.testing.assert_array_equal(H.pool(hidden, mask, "last"), jnp.stack([hidden[0, 2], hidden[1, 1]]))
    np.testing.assert_allclose(H.pool(hidden, mask, "mean")[1], hidden[1, :2].mean(0))


@pytest.mark.parametrize("head, pooling", [(H.SequenceClassificationHead(BERT.replace(dropout_rate=0.5), 3), "pooler"),
                                           (H.SequenceClassificationHead(BERT.replace(dropout_rate=0.5), 3), "first"),
                                           (H.TokenTaggingHead(BERT.replace(dropout_rate=0.5), 5), None)])
def test_classifier_dropout_is_on_in_training_only(head, pooling):
    # Backbone dropout off, head dropout on: any difference between the rngs comes from the head.
    model = WithHead(BERT.replace(dropout_rate=0.0), head, pooling)
    tokens = ids((2, 8))
    variables = random_variables(model, encoder_input_tokens=tokens)
    apply = jax.jit(model.apply, static_argnames="enable_dropout")
    train = [apply(variables, encoder_input_tokens=tokens, enable_dropout=True, rngs={"dropout": jax.random.key(i)})
             for i in range(2)]
    assert np.abs(np.asarray(train[0]) - np.asarray(train[1])).max() > 1e-3
    evals = [apply(variables, encoder_input_tokens=tokens, rngs={"dropout": jax.random.key(i)}) for i in range(2)]
    np.testing.assert_array_equal(np.asarray(evals[0]), np.asarray(evals[1]))
