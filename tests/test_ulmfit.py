"""ULMFiT: AWD-LSTM against torch.nn.LSTM, its dropouts, concat pooling, and the fine-tuning pieces
(slanted triangular rates, discriminative rates, gradual unfreezing) against the paper's formulas."""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from conftest import shared_data_dir
from t5lite.errors import ConfigError
from t5lite.data import word_vocab
from t5lite.models.awd_lstm import (AWDLSTM, AWDLSTMClassifier, AWDLSTMLanguageModel, PoolingLinearClassifier,
                                     concat_pool)
from t5lite.models.recurrent_config import AWDLSTMConfig
from t5lite.models.running_statistics import RUNNING_STATISTICS, sown_values, with_running_statistics
from t5lite.train import optimizers
from t5lite.objectives import recurrent as recurrent_objectives
from t5lite.train.partitioning import Partitioner
from t5lite.train.step import TrainTask

TINY = AWDLSTMConfig(vocab_size=50, emb_dim=6, hidden_dim=10, n_layers=3)


def _tokens():
    tokens = np.random.default_rng(0).integers(1, TINY.vocab_size, (2, 7)).astype(np.int32)
    tokens[1, 5:] = 0      # a shorter second row
    return tokens


def _torch_reference(params, tokens, cfg, hidden_kernels=None):
    """fastai's AWD-LSTM forward without dropout: embedding, then one torch.nn.LSTM per layer."""
    torch = pytest.importorskip("torch", reason="torch (the hf extra) is the reference LSTM")
    x = torch.tensor(np.asarray(params["embedding"]))[torch.tensor(tokens, dtype=torch.long)]
    outputs = []
    for k, (n_in, hidden) in enumerate(cfg.layer_dims()):
        p = params[f"lstm_{k}"]
        lstm = torch.nn.LSTM(n_in, hidden, batch_first=True)
        hh = np.asarray(p["hidden_kernel"] if hidden_kernels is None else hidden_kernels[k])
        with torch.no_grad():
            lstm.weight_ih_l0.copy_(torch.tensor(np.asarray(p["input_kernel"]).T))
            lstm.weight_hh_l0.copy_(torch.tensor(hh.T))
            lstm.bias_ih_l0.copy_(torch.tensor(np.asarray(p["input_bias"])))
            lstm.bias_hh_l0.copy_(torch.tensor(np.asarray(p["hidden_bias"])))
            x = lstm(x)[0]
        outputs.append(x.numpy())
    return outputs


def _init(module, *args):
    return nn.unbox(module.init(jax.random.key(0), *args))["params"]


def test_awd_lstm_without_dropout_equals_torch_lstm():
    tokens = _tokens()
    params = _init(AWDLSTM(TINY), tokens)
    ours = AWDLSTM(TINY).apply({"params": params}, tokens)[0]
    ref = _torch_reference(params, tokens, TINY)
    for k, (o, r) in enumerate(zip(ours, ref)):
        # Row 1 stops at its length (zeros after it); torch runs on over the padding.
        np.testing.assert_allclose(np.asarray(o)[0], r[0], rtol=1e-4, atol=1e-6, err_msg=f"layer {k}")
        np.testing.assert_allclose(np.asarray(o)[1, :5], r[1, :5], rtol=1e-4, atol=1e-6, err_msg=f"layer {k}")
        assert not np.asarray(o)[1, 5:].any()
    assert [o.shape[-1] for o in ours] == [10, 10, 6]


def test_weight_drop_masks_hidden_to_hidden_only():
    cfg = TINY.replace(embed_p=0.0, input_p=0.0, hidden_p=0.0, output_p=0.0, weight_p=0.5)
    tokens = _tokens()
    params = _init(AWDLSTM(cfg), tokens)
    (outputs, _), state = AWDLSTM(cfg).apply({"params": params}, tokens, enable_dropout=True,
                                             rngs={"dropout": jax.random.key(3)}, mutable=["intermediates"])
    dropped = [np.asarray(state["intermediates"][f"lstm_{k}"]["dropped_hidden_kernel"][0]) for k in range(3)]
    for k, d in enumerate(dropped):
        kernel = np.asarray(params[f"lstm_{k}"]["hidden_kernel"])
        zero = d == 0
        assert 0.3 < zero.mean() < 0.7
        np.testing.assert_allclose(d[~zero], kernel[~zero] / 0.5, rtol=1e-6)
    # The input kernels and biases are untouched: torch with only weight_hh replaced gives the output.
    ref = _torch_reference(params, tokens, cfg, hidden_kernels=dropped)
    np.testing.assert_allclose(np.asarray(outputs[-1])[0], ref[-1][0], rtol=1e-4, atol=1e-6)


def test_locked_dropout_uses_one_mask_per_sequence_for_every_step():
    from t5lite.models.awd_lstm import locked_dropout

    class Probe(nn.Module):
        @nn.compact
        def __call__(self, x):
            return locked_dropout(self, x, 0.5, True)

    out = np.asarray(Probe().apply({}, jnp.ones((8, 5, 16)), rngs={"dropout": jax.random.key(0)}))
    assert set(np.unique(out)) == {0.0, 2.0}                       # dropped, or kept and scaled by 1 / (1 - p)
    assert (out == out[:, :1]).all()                                # the same mask at every step of a sequence
    assert len({row[0].tobytes() for row in out}) > 1               # and another mask for another sequence


def test_embedding_dropout_drops_whole_rows():
    cfg = TINY.replace(embed_p=0.5, input_p=0.0, hidden_p=0.0, output_p=0.0, weight_p=0.0)
    tokens = np.arange(1, 41, dtype=np.int32).reshape(1, 40)
    params = _init(AWDLSTM(cfg), tokens)
    out = AWDLSTM(cfg).apply({"params": params}, tokens[:, :1], enable_dropout=True,
                             rngs={"dropout": jax.random.key(0)})[0]
    plain = AWDLSTM(cfg).apply({"params": params}, tokens[:, :1])[0]
    both = [AWDLSTM(cfg).apply({"params": dict(params, embedding=params["embedding"] * s)}, tokens[:, :1])[0][-1]
            for s in (0.0, 2.0)]
    assert any(np.allclose(np.asarray(out[-1]), np.asarray(b), rtol=1e-5, atol=1e-7) for b in both)
    assert not np.allclose(np.asarray(out[-1]), np.asarray(plain[-1]))


def test_concat_pool_matches_numpy():
    x = np.random.default_rng(1).normal(size=(3, 5, 4)).astype(np.float32)
    lengths = np.array([5, 2, 1])
    ours = np.asarray(concat_pool(jnp.asarray(x), jnp.asarray(lengths)))
    for b, n in enumerate(lengths):
        expected = np.concatenate([x[b, n - 1], x[b, :n].max(0), x[b, :n].mean(0)])
        np.testing.assert_allclose(ours[b], expected, rtol=1e-6)


def test_lm_decoder_is_tied_and_classifier_shapes():
    tokens = _tokens()
    lm = AWDLSTMLanguageModel(TINY)
    params = _init(lm, tokens)
    assert "decoder_kernel" not in params and set(params) == {"encoder", "decoder_bias"}
    logits = lm.apply({"params": params}, tokens)
    top = AWDLSTM(TINY).apply({"params": params["encoder"]}, tokens)[0][-1]
    np.testing.assert_allclose(np.asarray(logits), np.asarray(top @ params["encoder"]["embedding"].T), rtol=1e-5,
                               atol=1e-6)
    clf = AWDLSTMClassifier(TINY, num_classes=3)
    assert clf.apply({"params": _init(clf, tokens)}, tokens).shape == (2, 3)




def test_classifier_head_equals_fastai_linbndrop_in_torch():
    """fastai's PoolingLinearClassifier head without dropout — BatchNorm1d, Linear (no bias), ReLU,
    BatchNorm1d, Linear — in torch on the same weights: training-mode outputs over three batches,
    the running mean and variance they leave, then the evaluation-mode output."""
    torch = pytest.importorskip("torch", reason="torch (the hf extra) is the reference BatchNorm1d")
    rng = np.random.default_rng(0)
    # An LM's pooled features: an offset ten times their spread across sentences.
    batches = [rng.normal(0.3, 0.03, size=(8, 12)).astype(np.float32) for _ in range(4)]
    head = PoolingLinearClassifier(3, hidden=5, ps=(0.0, 0.0))
    params = _init(head, batches[0])
    params = {**params, "bn_0": {**params["bn_0"], "scale": jnp.asarray(rng.uniform(0.5, 2, 12), jnp.float32),
                                 "bias": jnp.asarray(rng.normal(size=12), jnp.float32)}}
    ref = torch.nn.Sequential(torch.nn.BatchNorm1d(12), torch.nn.Linear(12, 5, bias=False), torch.nn.ReLU(),
                              torch.nn.BatchNorm1d(5), torch.nn.Linear(5, 3, bias=False))
    with torch.no_grad():
        for k, (bn, linear) in enumerate(((ref[0], ref[1]), (ref[3], ref[4]))):
            bn.weight.copy_(torch.tensor(np.asarray(params[f"bn_{k}"]["scale"])))
            bn.bias.copy_(torch.tensor(np.asarray(params[f"bn_{k}"]["bias"])))
            linear.weight.copy_(torch.tensor(np.asarray(params[f"linear_{k}"]["kernel"]).T))
    ref.train()
    for x in batches[:3]:
        out, state = head.apply({"params": params}, x, enable_dropout=True, mutable=[RUNNING_STATISTICS])
        np.testing.assert_allclose(np.asarray(out), ref(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-5)
        params = with_running_statistics(params, sown_values(state[RUNNING_STATISTICS]))
    for k, bn in enumerate((ref[0], ref[3])):
        np.testing.assert_allclose(np.asarray(params[f"bn_{k}"]["running_mean"]), bn.running_mean.numpy(), rtol=1e-5,
                                   atol=1e-7)
        np.testing.assert_allclose(np.asarray(params[f"bn_{k}"]["running_var"]), bn.running_var.numpy(), rtol=1e-5)
    ref.eval()
    np.testing.assert_allclose(np.asarray(head.apply({"params": params}, batches[3])),
                               ref(torch.tensor(batches[3])).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_a_train_step_stores_the_heads_running_statistics(monkeypatch):
    """The trainer writes the BatchNorm statistics of the step's batch (torch's momentum 0.1,
    unbiased variance) over the head's params; no gradient moves them (learning rate 0 here)."""
    monkeypatch.setattr(recurrent_objectives, "word_vocabulary",
                        lambda: word_vocab.build(["a b c"], size=TINY.vocab_size))
    config = TINY.replace(embed_p=0.0, input_p=0.0, weight_p=0.0, hidden_p=0.0, output_p=0.0)
    tokens = np.concatenate([_tokens(), _tokens()[:, ::-1]])
    tokens[2:, :2] = 0
    tokens = np.stack([np.concatenate([r[r > 0], r[r == 0]]) for r in tokens])    # padding at the end
    batch = {"encoder_input_tokens": jnp.asarray(tokens), "label": jnp.asarray([[0], [1], [1], [0]])}
    schedule = optax.constant_schedule(0.0)
    task = TrainTask(config, optax.sgd(schedule), schedule, Partitioner(), {"encoder_input_tokens": tokens.shape[1]},
                     objective=recurrent_objectives.RecurrentClassificationObjective())
    state = task.init_state(0)
    with task.mesh_context():
        new, _ = jax.jit(task.train_step)(state, batch)
    params = jax.device_get(state.params)
    top = AWDLSTM(config).apply({"params": params["encoder"]}, tokens)[0][-1]
    pooled = np.asarray(concat_pool(top, jnp.asarray((tokens > 0).sum(1))))
    stored = jax.device_get(new.params)["head"]["bn_0"]
    np.testing.assert_allclose(stored["running_mean"], 0.1 * pooled.mean(0), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(stored["running_var"], 0.9 + 0.1 * pooled.var(0, ddof=1), rtol=1e-4)
    np.testing.assert_array_equal(stored["scale"], params["head"]["bn_0"]["scale"])


def test_a_peft_run_of_a_batchnorm_head_is_refused_with_the_fix(monkeypatch):
    """BitFit trains the BatchNorm biases but not their running statistics, which no PEFT tree
    holds: the step says so as a ConfigError naming the fix, not a KeyError."""
    from t5lite.models import peft
    monkeypatch.setattr(recurrent_objectives, "word_vocabulary",
                        lambda: word_vocab.build(["a b c"], size=TINY.vocab_size))
    tokens = _tokens()
    batch = {"encoder_input_tokens": jnp.asarray(tokens), "label": jnp.asarray([[0], [1]])}
    schedule = optax.constant_schedule(0.0)
    task = TrainTask(TINY, optax.sgd(schedule), schedule, Partitioner(), {"encoder_input_tokens": tokens.shape[1]},
                     objective=recurrent_objectives.RecurrentClassificationObjective(), peft=peft.BitFit())
    state = task.init_state(0)
    with task.mesh_context(), pytest.raises(ConfigError, match="without train.peft"):
        task.train_step(state, batch, frozen=task.init_base(0, None))

# --- The LM objective's activation regularisers (AR and TAR).

def _ar_tar_reference(raw, dropped, tokens):
    """fastai's RNNRegularizer on each row's real steps (fastai's LM rows have no padding):
    AR = dropped.pow(2).mean(), TAR = (raw[:, 1:] - raw[:, :-1]).pow(2).mean()."""
    steps = np.concatenate([dropped[b, :n] for b, n in enumerate((tokens != 0).sum(1))])
    changes = np.concatenate([raw[b, 1:n] - raw[b, :n - 1] for b, n in enumerate((tokens != 0).sum(1))])
    return float((steps ** 2).mean()), float((changes ** 2).mean())


def test_activation_regularisers_match_fastais_formulas():
    rng = np.random.default_rng(2)
    raw, dropped = rng.normal(size=(2, 7, 4)).astype(np.float32), rng.normal(size=(2, 7, 4)).astype(np.float32)
    tokens = _tokens()
    (ar, ar_n), (tar, tar_n) = recurrent_objectives.activation_regularisers(raw, dropped, tokens)
    np.testing.assert_allclose([float(ar / ar_n), float(tar / tar_n)], _ar_tar_reference(raw, dropped, tokens),
                               rtol=1e-5)


def test_lm_training_loss_is_cross_entropy_plus_2_ar_plus_tar():
    """fastai's LM loss: cross entropy + alpha (2) * AR + beta (1) * TAR, the AWD-LSTM's own sown
    top-layer outputs of the same dropout draw; evaluation is the cross entropy alone."""
    tokens = jnp.asarray(_tokens())
    objective = recurrent_objectives.AWDLSTMLMObjective()
    module = AWDLSTMLanguageModel(TINY)
    params = _init(module, tokens)
    batch = {"encoder_input_tokens": tokens}
    rng = jax.random.key(3)
    value, metrics = objective.loss_and_metrics(module, params, batch, rng, objective.normalizers(batch, None), None)
    logits, state = module.apply({"params": params}, tokens, enable_dropout=True, rngs={"dropout": rng},
                                 mutable=["intermediates"])
    raw, dropped = (np.asarray(state["intermediates"][k][0]) for k in ("raw_top", "dropped_top"))
    tok = np.asarray(tokens)
    log_probs = np.asarray(jax.nn.log_softmax(logits))
    ce = [-log_probs[b, t, tok[b, t + 1]] for b in range(2) for t in range(6) if tok[b, t + 1]]
    ar, tar = _ar_tar_reference(raw, dropped, tok)
    np.testing.assert_allclose(float(value), np.mean(ce) + 2.0 * ar + 1.0 * tar, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["loss"][0] / metrics["loss"][1]), np.mean(ce), rtol=1e-5)
    evaluated, _ = objective.loss_and_metrics(module, params, batch, None, objective.normalizers(batch, None), None)
    eval_log_probs = np.asarray(jax.nn.log_softmax(module.apply({"params": params}, tokens)))
    np.testing.assert_allclose(float(evaluated), np.mean(
        [-eval_log_probs[b, t, tok[b, t + 1]] for b in range(2) for t in range(6) if tok[b, t + 1]]), rtol=1e-5)


def test_awd_lstm_lm_on_real_text_keeps_its_top_layer_out_of_saturation(monkeypatch):
    """A tied-decoder AWD-LSTM LM trained with the run's AdamW on real SST-2 sentences: without
    AR/TAR it fits the unigram distribution with the same saturated top-layer output for every
    word (|h| > 0.9 at ~90% of held-out steps after 60 steps), which left the pre-trained LMs at
    unigram perplexity with features no classifier could use; with fastai's AR/TAR it stays out."""
    from t5lite.data import word_converters, word_vocab
    lines = (shared_data_dir() / "glue" / "SST-2" / "train.tsv").read_text().splitlines()[1:2001]
    texts = [line.rsplit("\t", 1)[0] for line in lines]
    vocabulary = word_vocab.build(texts, size=500, lowercase=True)
    for module in (word_converters, recurrent_objectives):
        monkeypatch.setattr(module, "word_vocabulary", lambda: vocabulary)
    rows = np.stack([r["encoder_input_tokens"] for r in word_converters.WordLMConverter().convert(
        [{"targets_pretokenized": t} for t in texts], {"targets": 16})])
    train, held_out = rows[:1800], jnp.asarray(rows[1800:])
    objective = recurrent_objectives.AWDLSTMLMObjective()
    module = objective.build_model(AWDLSTMConfig(vocab_size=500, emb_dim=16, hidden_dim=32, n_layers=3))
    params = _init(module, held_out[:1])
    steps = 60
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
        optax.warmup_cosine_decay_schedule(0.0, 3e-3, 10, steps), b1=0.7, b2=0.99, weight_decay=0.01))
    state = tx.init(params)

    @jax.jit
    def step(params, state, tokens, rng):
        batch = {"encoder_input_tokens": tokens}
        grads, _ = jax.grad(lambda p: objective.loss_and_metrics(module, p, batch, rng, objective.normalizers(
            batch, None), None), has_aux=True)(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    order = np.random.default_rng(0).integers(0, len(train), (steps, 16))
    for i in range(steps):
        params, state = step(params, state, jnp.asarray(train[order[i]]), jax.random.key(i))
    top = AWDLSTM(module.config).apply({"params": params["encoder"]}, held_out)[0][-1]
    top = np.asarray(top)[np.asarray(held_out) != 0]
    assert np.mean(np.abs(top) > 0.9) < 0.05


# --- ULMFiT's fine-tuning pieces.

def _stlr_reference(t, T, lr_max, cut_frac=0.1, ratio=32):
    """Howard and Ruder (2018), eq. 3."""
    cut = math.floor(T * cut_frac)
    p = t / cut if t < cut else 1 - (t - cut) / (cut * (1 / cut_frac - 1))
    return lr_max * (1 + p * (ratio - 1)) / ratio


def test_slanted_triangular_matches_the_paper_step_by_step():
    total = 200
    schedule = optimizers.slanted_triangular(max_learning_rate=0.01, total_steps=total)
    ours = np.array([float(schedule(t)) for t in range(total + 1)])
    expected = np.array([_stlr_reference(t, total, 0.01) for t in range(total + 1)])
    np.testing.assert_allclose(ours, expected, rtol=1e-6)
    assert ours.argmax() == 20 and math.isclose(ours[0], 0.01 / 32, rel_tol=1e-6)


def _specs():
    """A Transformer-like tree (embeddings, two layers, a head) and an AWD-LSTM classifier's."""
    return {"token_embedder": {"embedding": P("vocab", "embed")},
            "encoder": {"layers_0": {"kernel": P("embed", "mlp")}, "layers_1": {"kernel": P("embed", "mlp")},
                        "encoder_norm": {"scale": P("embed")}},
            "head": {"kernel": P("embed", "classes")}}


def test_layer_groups_of_transformer_and_awd_lstm():
    groups, n = optimizers.layer_groups(_specs())
    assert n == 4
    assert groups["token_embedder"]["embedding"] == 0
    assert groups["encoder"]["layers_0"]["kernel"] == 1 and groups["encoder"]["layers_1"]["kernel"] == 2
    assert groups["encoder"]["encoder_norm"]["scale"] == 3 and groups["head"]["kernel"] == 3
    clf = AWDLSTMClassifier(TINY)
    specs = nn.get_partition_spec(jax.eval_shape(lambda: clf.init(jax.random.key(0), _tokens())))["params"]
    groups, n = optimizers.layer_groups(specs)
    assert n == 5     # fastai's awd_lstm_clas_split: embedding, 3 LSTMs, classifier
    assert groups["encoder"]["embedding"] == 0 and groups["encoder"]["lstm_2"]["hidden_kernel"] == 3
    assert all(g == 4 for g in jax.tree.leaves(groups["head"]))


def _params():
    rng = np.random.default_rng(0)
    shapes = {"token_embedder": {"embedding": (4, 3)},
              "encoder": {"layers_0": {"kernel": (3, 2)}, "layers_1": {"kernel": (3, 2)},
                          "encoder_norm": {"scale": (3,)}},
              "head": {"kernel": (3, 2)}}
    return jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s), jnp.float32), shapes,
                        is_leaf=lambda x: isinstance(x, tuple))


def test_discriminative_rates_are_sgd_steps_divided_by_2_6_per_group():
    lr = 0.1
    make = optimizers.layerwise(schedule=optax.constant_schedule(lr), optimizer=lambda schedule: optax.sgd(schedule),
                                decay=2.6)
    tx = make(_specs())
    params = _params()
    grads = jax.tree.map(lambda p: jnp.ones_like(p) * 0.5, params)
    state = tx.init(params)
    for step in range(3):
        updates, state = tx.update(grads, state, params)
        # theta_l <- theta_l - eta_l grad, eta_{l-1} = eta_l / 2.6 (ULMFiT eq. 2), top group at eta.
        for path, group in (((("token_embedder", "embedding")), 0), (("encoder", "layers_0", "kernel"), 1),
                            (("encoder", "layers_1", "kernel"), 2), (("encoder", "encoder_norm", "scale"), 3),
                            (("head", "kernel"), 3)):
            u = updates
            for key in path:
                u = u[key]
            np.testing.assert_allclose(np.asarray(u), -lr / 2.6 ** (3 - group) * 0.5, rtol=1e-6)


def _trained_groups(steps: int, **unfreezing):
    """(step, layer group, whether its update is non-zero) of `steps` Adam updates under `layerwise`
    with `unfreezing`; also the number of groups."""
    make = optimizers.layerwise(schedule=optax.constant_schedule(0.01), optimizer=lambda schedule: optax.adam(schedule),
                                decay=1.0, **unfreezing)
    tx = make(_specs())
    params = _params()
    grads = jax.tree.map(jnp.ones_like, params)
    groups, n = optimizers.layer_groups(_specs())
    state = tx.init(params)
    trained = []
    for step in range(steps):
        updates, state = tx.update(grads, state, params)
        trained += [(step, g, bool(np.any(np.asarray(u) != 0)))
                    for u, g in zip(jax.tree.leaves(updates), jax.tree.leaves(groups))]
    return trained, n


def test_gradual_unfreezing_trains_one_more_group_every_n_steps_with_adam():
    every = 2
    trained, n = _trained_groups(10, unfreeze_every=every)
    for step, g, moved in trained:
        lowest = n - 1 - step // every    # the lowest trained group at this step
        assert moved == (g >= lowest), (step, g)


@pytest.mark.parametrize("epochs, steps_per_epoch", [(1.0, 3), (0.5, 3)])
def test_gradual_unfreezing_by_epoch_follows_its_formula(epochs, steps_per_epoch):
    """ULMFiT unfreezes one more group per epoch: group g trains from step ceil((top - g) * E * S)
    (E epochs of S steps), here also at a fractional 1.5 steps per unfreezing."""
    trained, n = _trained_groups(12, unfreeze_every_epochs=epochs, steps_per_epoch=steps_per_epoch)
    for step, g, moved in trained:
        first = math.ceil((n - 1 - g) * epochs * steps_per_epoch)
        assert moved == (step >= first), (step, g)


def test_gradual_unfreezing_by_epoch_needs_the_epoch_length():
    with pytest.raises(ConfigError, match="steps_per_epoch"):
        optimizers.layerwise(schedule=optax.constant_schedule(0.01), optimizer=lambda schedule: optax.adam(schedule),
                             unfreeze_every_epochs=1.0)
    with pytest.raises(ConfigError, match="not both"):
        optimizers.layerwise(schedule=optax.constant_schedule(0.01), optimizer=lambda schedule: optax.adam(schedule),
                             unfreeze_every=5, unfreeze_every_epochs=1.0, steps_per_epoch=10)


def test_layer_groups_of_a_bert_classifier():
    """The same pieces fine-tune Transformers: embeddings, one group per layer, the head on top."""
    from t5lite import models
    from t5lite.models import heads
    from t5lite.models.with_head import WithHead
    cfg = models.get_config("bert_tiny")
    module = WithHead(cfg, heads.SequenceClassificationHead(cfg, 2), "pooler")
    tokens = jnp.ones((1, 8), jnp.int32)
    abstract = jax.eval_shape(lambda: module.init(jax.random.key(0), encoder_input_tokens=tokens,
                                                  token_type_ids=tokens))
    groups, n = optimizers.layer_groups(nn.get_partition_spec(abstract)["params"])
    flat = {"/".join(str(getattr(k, "key", k)) for k in path): g
            for path, g in jax.tree_util.tree_leaves_with_path(groups)}
    assert n == cfg.num_encoder_layers + 2
    assert {g for p, g in flat.items() if "embed" in p} == {0}
    assert {g for p, g in flat.items() if "layers_1" in p} == {2}
    assert {g for p, g in flat.items() if p.startswith("head")} == {n - 1}


# --- fastai's initialisation, LM data layout and stateful LM.

def test_lstm_params_and_init_are_torchs_two_biases():
    """torch.nn.LSTM has two biases, b_ih and b_hh, and initialises every array U(+-1/sqrt(hidden))
    (torch/nn/modules/rnn.py, RNNBase.reset_parameters): the gate bias is their sum, whose spread is
    sqrt(2) times one uniform's. Each of ours against torch's own draws (two-sample KS test)."""
    torch = pytest.importorskip("torch", reason="torch (the hf extra) is the reference LSTM")
    from scipy.stats import ks_2samp
    cfg = AWDLSTMConfig(vocab_size=50, emb_dim=64, hidden_dim=256, n_layers=4)
    params = _init(AWDLSTM(cfg), _tokens())
    torch.manual_seed(0)
    refs = [torch.nn.LSTM(64 if k == 0 else 256, 256) for k in range(3)]     # our layers 0-2: 256 wide
    pairs = {"input_kernel": "weight_ih_l0", "hidden_kernel": "weight_hh_l0", "input_bias": "bias_ih_l0",
             "hidden_bias": "bias_hh_l0"}
    for ours_name, theirs_name in pairs.items():
        ours = np.concatenate([np.asarray(params[f"lstm_{k}"][ours_name]).ravel() for k in range(3)])
        theirs = np.concatenate([getattr(ref, theirs_name).detach().numpy().ravel() for ref in refs])
        assert np.abs(ours).max() <= 1 / 16 and ks_2samp(ours, theirs).pvalue > 0.01, ours_name
    summed = np.concatenate([np.asarray(params[f"lstm_{k}"]["input_bias"] + params[f"lstm_{k}"]["hidden_bias"])
                             for k in range(3)])
    assert ks_2samp(summed, np.concatenate([(r.bias_ih_l0 + r.bias_hh_l0).detach().numpy() for r in refs])).pvalue > 0.01


def test_classifier_head_init_is_fastais():
    """fastai's LinBnDrop (fastai/layers.py): `BatchNorm(n_in, ndim=1)` is `_get_norm`, which sets
    `bn.bias.data.fill_(1e-3)` and `bn.weight.data.fill_(1.)`; `nn.Linear(n_in, n_out, bias=False)`
    keeps torch's default init, kaiming_uniform_(a=sqrt(5)) = U(+-1/sqrt(fan in)); no `init` is
    applied to the classifier (fastai/text/models/core.py, get_text_classifier: awd_lstm_clas_config
    has none). Linear kernels against torch's own draws (two-sample KS test)."""
    torch = pytest.importorskip("torch", reason="torch (the hf extra) is the reference nn.Linear")
    from scipy.stats import ks_2samp

    def fastai_batchnorm(nf):   # fastai/layers.py, _get_norm('BatchNorm', nf, ndim=1), transcribed
        bn = torch.nn.BatchNorm1d(nf)
        bn.bias.data.fill_(1e-3)
        bn.weight.data.fill_(1.)
        return bn

    params = _init(PoolingLinearClassifier(2, hidden=50), np.ones((2, 1200), np.float32))
    for k, (n_in, n_out) in enumerate(((1200, 50), (50, 2))):
        bn = fastai_batchnorm(n_in)
        np.testing.assert_array_equal(params[f"bn_{k}"]["bias"], bn.bias.detach().numpy())
        np.testing.assert_array_equal(params[f"bn_{k}"]["scale"], bn.weight.detach().numpy())
        kernel = np.asarray(params[f"linear_{k}"]["kernel"])
        theirs = torch.nn.Linear(n_in, n_out, bias=False).weight.detach().numpy()
        assert kernel.shape == theirs.T.shape and np.abs(kernel).max() <= 1 / math.sqrt(n_in)
        if kernel.size > 1000:
            assert ks_2samp(kernel.ravel(), theirs.ravel()).pvalue > 0.01


def _fastai_lm_batches(stream, bs, seq_len):
    """fastai/text/data.py, LMDataLoader.__init__ and create_item, transcribed: (x, y) of every
    item, grouped into batches of `bs` items (item `seq` is row seq % bs of batch seq // bs)."""
    corpus = (len(stream) - 1) // bs * bs      # round_multiple(sum(lens)-1, bs, round_down=True)
    bl = corpus // bs
    n_batches = bl // seq_len + int(bl % seq_len != 0)
    last_len = bl - (n_batches - 1) * seq_len
    batches = []
    for b in range(n_batches):
        items = []
        for seq in range(b * bs, (b + 1) * bs):
            sl = last_len if seq // bs == n_batches - 1 else seq_len
            st = (seq % bs) * bl + (seq // bs) * seq_len
            txt = stream[st: st + sl + 1]
            items.append((txt[:-1], txt[1:]))
        batches.append(items)
    return batches


def test_lm_stream_is_laid_out_as_fastais_lmdataloader(monkeypatch):
    """The `word_lm_stream` rows are fastai's LMDataLoader items: row r of batch k continues row r
    of batch k - 1; reads ids[:-1], predicts ids[1:]. Only fastai's shorter last batch is dropped."""
    from t5lite.data import converter_registry, word_converters
    lines = (shared_data_dir() / "glue" / "SST-2" / "train.tsv").read_text().splitlines()[1:201]
    texts = [line.rsplit("\t", 1)[0] for line in lines]
    vocabulary = word_vocab.build(texts, size=300, lowercase=True)
    monkeypatch.setattr(word_converters, "word_vocabulary", lambda: vocabulary)
    converter = converter_registry.get_feature_converter("word_lm_stream", stream_examples=100)
    rows = converter.convert([{"inputs_pretokenized": t} for t in texts], {"targets": 9})
    ours = list(converter.batch(rows, 4))
    for first, last in ((0, 100), (100, 200)):      # two streams of 100 sentences
        stream = np.concatenate([vocabulary.encode_tokens(["<S>", *vocabulary.tokens(t), "</S>"])
                                 for t in texts[first:last]])
        theirs = _fastai_lm_batches(stream, 4, 8)
        assert len(theirs[-1][0][0]) < 8           # a shorter last batch, which we drop
        batches, ours = ours[:len(theirs) - 1], ours[len(theirs) - 1:]
        for k, (batch, items) in enumerate(zip(batches, theirs)):
            np.testing.assert_array_equal(batch["encoder_input_tokens"][:, :-1], [x for x, _ in items])
            np.testing.assert_array_equal(batch["encoder_input_tokens"][:, 1:], [y for _, y in items])
            np.testing.assert_array_equal(batch["reset_state"], int(k == 0))
            assert batch["_examples"] == (last - first if k == len(batches) - 1 else 0)
    assert not ours


def _torch_lm(torch, params, tokens, hidden):
    """fastai's AWD_LSTM language model without dropout (fastai/text/models/awdlstm.py, AWD_LSTM.forward:
    each layer `rnn(output, self.hidden[l])`, the new hidden kept detached for the next batch;
    LinearDecoder tied to the embedding): (logits, new hidden)."""
    x = torch.tensor(np.asarray(params["encoder"]["embedding"]))[torch.tensor(np.asarray(tokens), dtype=torch.long)]
    new = []
    for k, (n_in, width) in enumerate(TINY.layer_dims()):
        p = params["encoder"][f"lstm_{k}"]
        lstm = torch.nn.LSTM(n_in, width, batch_first=True)
        with torch.no_grad():
            for theirs, ours in (("weight_ih_l0", "input_kernel"), ("weight_hh_l0", "hidden_kernel")):
                getattr(lstm, theirs).copy_(torch.tensor(np.asarray(p[ours]).T))
            lstm.bias_ih_l0.copy_(torch.tensor(np.asarray(p["input_bias"])))
            lstm.bias_hh_l0.copy_(torch.tensor(np.asarray(p["hidden_bias"])))
            x, state = lstm(x, hidden[k])
        new.append(tuple(s.detach() for s in state))
    embedding = torch.tensor(np.asarray(params["encoder"]["embedding"]))
    logits = x @ embedding.T + torch.tensor(np.asarray(params["decoder_bias"]))
    return logits.detach().numpy(), new


def test_stateful_lm_carries_its_state_across_batches_as_fastai(monkeypatch):
    """Two train steps (learning rate 0) of a stream's first two batches: after each, the trainer
    stores the LSTM states that fastai's AWD_LSTM keeps in `self.hidden` (torch, same weights);
    the second batch's loss is the cross entropy of torch's logits from that state, not from zeros."""
    torch = pytest.importorskip("torch", reason="torch (the hf extra) is the reference LSTM")
    monkeypatch.setattr(recurrent_objectives, "word_vocabulary",
                        lambda: word_vocab.build(["a b c"], size=TINY.vocab_size))
    config = TINY.replace(embed_p=0.0, input_p=0.0, weight_p=0.0, hidden_p=0.0, output_p=0.0)
    stream = np.random.default_rng(0).integers(1, TINY.vocab_size, 2 * 2 * 6 + 1).astype(np.int32)
    items = _fastai_lm_batches(stream, 2, 6)
    batches = [{"encoder_input_tokens": jnp.asarray([np.append(x, y[-1]) for x, y in b]),
                "reset_state": jnp.full((2, 1), int(k == 0), jnp.int32)} for k, b in enumerate(items)]
    schedule = optax.constant_schedule(0.0)
    objective = recurrent_objectives.AWDLSTMLMObjective(stream_rows=2)
    task = TrainTask(config, optax.sgd(schedule), schedule, Partitioner(),
                     {"encoder_input_tokens": 7, "reset_state": 1}, objective=objective)
    state = task.init_state(0)
    params = jax.device_get(state.params)
    hidden = [tuple(torch.zeros(1, 2, width) for _ in "hc") for _, width in TINY.layer_dims()]
    step = jax.jit(task.train_step)
    for batch, batch_items in zip(batches, items):
        logits, hidden = _torch_lm(torch, params, [x for x, _ in batch_items], hidden)
        targets = np.asarray([y for _, y in batch_items])
        ce = -np.mean(np.take_along_axis(torch.log_softmax(torch.tensor(logits), -1).numpy(), targets[..., None], -1))
        with task.mesh_context():
            state, metrics = step(state, batch)
        np.testing.assert_allclose(float(metrics["loss"]), ce, rtol=1e-5)
        stored = jax.device_get(state.params)
        for k, (h, c) in enumerate(hidden):
            np.testing.assert_allclose(stored[f"carried_state_{k}_h"], h[0].numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(stored[f"carried_state_{k}_c"], c[0].numpy(), rtol=1e-5, atol=1e-6)
    zero = [tuple(torch.zeros(1, 2, width) for _ in "hc") for _, width in TINY.layer_dims()]
    from_zero, _ = _torch_lm(torch, params, [x for x, _ in items[1]], zero)
    targets = np.asarray([y for _, y in items[1]])
    assert not np.isclose(-np.mean(np.take_along_axis(torch.log_softmax(torch.tensor(from_zero), -1).numpy(),
                                                      targets[..., None], -1)), float(metrics["loss"]), rtol=1e-4)


def test_stateful_lm_on_sentence_rows_says_which_converter(monkeypatch):
    objective = recurrent_objectives.AWDLSTMLMObjective(stream_rows=2)
    with pytest.raises(ConfigError, match="word_lm_stream"):
        objective.normalizers({"encoder_input_tokens": jnp.ones((2, 5), jnp.int32)}, None)


@pytest.mark.parametrize("batch_size", [2, 3])
def test_stream_validation_perplexity_carries_the_state_as_fastai(monkeypatch, batch_size):
    """Validation as fastai's (ModelResetter.before_validate, then the LMDataLoader batches in order
    through AWD_LSTM, its hidden state carried): exp of the mean cross entropy of torch's logits.
    It carries the state itself, so a model trained on 2 stream rows evaluates at any batch size."""
    torch = pytest.importorskip("torch", reason="torch (the hf extra) is the reference LSTM")
    from t5lite.data import word_converters
    texts = ["the cat sat on the mat", "a dog ran in the park and the cat ran too", "the end of it all"] * 3
    vocabulary = word_vocab.build(texts, size=TINY.vocab_size)
    for module in (word_converters, recurrent_objectives):
        monkeypatch.setattr(module, "word_vocabulary", lambda: vocabulary)

    class Texts:
        name = "texts"

        def get_dataset(self, split, lengths, data_dir=None):
            return iter([{"targets_pretokenized": t} for t in texts])

    objective = recurrent_objectives.AWDLSTMLMObjective(stream_rows=2)
    module = objective.build_model(TINY)
    params = _init(module, *objective.init_features({}).values())
    evaluator = objective.evaluators(Texts(), "validation", {"targets": 6}, batch_size=batch_size)["texts"]
    stream = np.concatenate([vocabulary.encode_tokens(["<S>", *vocabulary.tokens(t), "</S>"]) for t in texts])
    hidden = [tuple(torch.zeros(1, batch_size, width) for _ in "hc") for _, width in TINY.layer_dims()]
    losses = []
    for items in _fastai_lm_batches(stream, batch_size, 5)[:-1]:     # fastai's shorter last batch is dropped
        logits, hidden = _torch_lm(torch, params, [x for x, _ in items], hidden)
        targets = np.asarray([y for _, y in items])
        losses.append(-np.take_along_axis(torch.log_softmax(torch.tensor(logits), -1).numpy(), targets[..., None], -1))
    assert len(losses) > 2
    result = evaluator.evaluate(module, params)
    np.testing.assert_allclose(result.metrics["perplexity"], math.exp(np.mean(losses)), rtol=1e-5)
    assert result.num_examples() == len(texts)


def test_a_stateful_lm_read_at_another_batch_size_is_refused_with_the_training_one(tmp_path):
    """The LM's carried state has a row per training batch row (stream_rows = %BATCH_SIZE), so a
    config with another BATCH_SIZE builds another model: the refusal names the run's BATCH_SIZE,
    not a preset or vocab_size."""
    from t5lite.errors import CheckpointMismatchError
    from t5lite.infer import checkpoint_reader
    from t5lite.train.checkpoints import Checkpointer
    def params(rows):
        return _init(AWDLSTMLanguageModel(TINY, rows), jnp.ones((rows, 2), jnp.int32), jnp.ones((rows, 1), jnp.int32))
    ckpt = Checkpointer(str(tmp_path / "checkpoints"), save_every=1, async_save=False)
    ckpt.save(0, {"params": params(8)}, {}, force=True)
    ckpt.close()
    abstract = jax.eval_shape(lambda: params(4))
    with pytest.raises(CheckpointMismatchError) as refusal:
        checkpoint_reader.restore_params(str(tmp_path), abstract)
    message = str(refusal.value)
    assert "trained with BATCH_SIZE = 8" in message and "--gin.BATCH_SIZE=8" in message, message
    assert "eval.batch_size" in message and "preset" not in message, message
