"""Skip-Thought: the loss equals a numpy re-derivation of Kiros et al. (2015) (each sentence's vector
conditions a decoder of the sentence before and one of the sentence after it, teacher-forced token
cross entropy summed over both, no loss on a side without a neighbour in the batch and paragraph);
gradients reach the encoder; the config trains bert_tiny through `t5lite train`, resumes, and
`t5lite embed` reads the run's encoder."""
import json
import os

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from conftest import REPO, assert_close, assert_embed_reads_run, shared_data_dir

from t5lite import cli
from t5lite.data import catalog
from t5lite.models.config import PRESETS
from t5lite.objectives.base import LossConfig
from t5lite.objectives.quick_thought import QuickThoughtObjective
from t5lite.objectives.skip_thought import SkipThoughtObjective, neighbour_targets

CONFIG = str(REPO / "configs/local/bert_tiny_skip_thought.gin")
pytestmark = pytest.mark.usefixtures("clean_gin_state")


def _model(length=12):
    objective = SkipThoughtObjective()
    config = PRESETS["bert_tiny"]().replace(dropout_rate=0.0, vocab_size=300)
    module = objective.build_model(config)
    params = module.init(jax.random.PRNGKey(0), **objective.init_features({"text0_input_tokens": length}))["params"]
    return objective, module, params


def _batch(paragraphs, length=12, seed=0):
    """Rows `[CLS] words [SEP]` then padding, as the consecutive_sentences converter gives."""
    rng = np.random.RandomState(seed)
    tokens = np.zeros((len(paragraphs), length), np.int32)
    for row in tokens:
        n = rng.randint(1, length - 2)
        row[0], row[1:n + 1], row[n + 1] = 2, rng.randint(5, 300, n), 3
    return {"text0_input_tokens": jnp.asarray(tokens), "paragraph": jnp.asarray(paragraphs, jnp.int32)[:, None]}


def _loss(objective, module, params, batch):
    normalizers = objective.normalizers(batch, LossConfig())
    return objective.loss_and_metrics(module, params, batch, jax.random.PRNGKey(1), normalizers, LossConfig())


def _reference_loss(module, params, batch):
    """sum_i sum_{side, j = i -+ 1 in the batch and i's paragraph} -log p_side(s_j | h_i), tokens of s_j
    after [CLS] up to its [SEP], each decoder reading s_j's tokens before the one it predicts;
    divided by the number of predicted tokens. Logits from each decoder run alone, one pair at a time."""
    tokens, paragraph = np.asarray(batch["text0_input_tokens"]), np.asarray(batch["paragraph"])[:, 0]
    vectors = module.apply({"params": params}, batch["text0_input_tokens"], method="embed")
    # Causal: the logits at s_j's own positions do not see the padding after it, so every pair
    # runs at the full length (one compile per side) and keeps its first n - 1 rows.
    decode = jax.jit(lambda vector, inputs, side: module.apply({"params": params}, vector, inputs, side,
                                                               method="decode"), static_argnums=2)
    total, count = 0.0, 0
    for i in range(len(tokens)):
        for side, j in (("previous", i - 1), ("next", i + 1)):
            if not (0 <= j < len(tokens)) or paragraph[j] != paragraph[i]:
                continue
            n = int(np.sum(tokens[j] != 0))   # [CLS] w_1 .. w_m [SEP]
            logits = decode(vectors[i:i + 1], jnp.asarray(tokens[j:j + 1, :-1]), side)
            logits = np.asarray(logits[0, :n - 1], np.float64)
            log_p = logits - logits.max(-1, keepdims=True)
            log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
            total -= sum(log_p[t, tokens[j, t + 1]] for t in range(n - 1))
            count += n - 1
    return total / count, count


@pytest.mark.parametrize("paragraphs", [[0, 0, 0, 0, 0], [0, 0, 0, 1, 1], [4, 5, 5, 6, 7]])
def test_loss_equals_a_numpy_rederivation_of_the_papers_objective(paragraphs):
    objective, module, params = _model()
    batch = _batch(paragraphs)
    loss, metrics = _loss(objective, module, params, batch)
    expected, count = _reference_loss(module, params, batch)
    assert_close(float(loss), expected, rtol=1e-5)
    assert float(metrics["target_tokens"]) == count
    assert_close(float(metrics["loss"][0] / metrics["loss"][1]), expected, rtol=1e-5)
    # an untrained decoder: about log(vocabulary) per token
    assert float(loss) == pytest.approx(np.log(300), rel=0.1)


def _hf_state(decoder):
    """Hugging Face BertModel names of a `SentenceDecoder`'s params (post-norm BERT layers)."""
    t = lambda x: np.asarray(x, np.float32)
    stack = decoder["decoder"]
    state = {"embeddings.word_embeddings.weight": t(decoder["token_embedder"]["embedding"]),
             "embeddings.position_embeddings.weight": t(stack["position_embedder"]["table"]["embedding"]),
             "embeddings.token_type_embeddings.weight": t(stack["token_type_embedder"]["embedding"]),
             "embeddings.LayerNorm.weight": t(stack["embedding_norm"]["scale"]),
             "embeddings.LayerNorm.bias": t(stack["embedding_norm"]["bias"])}
    for i in range(2):
        layer, prefix = stack[f"layers_{i}"], f"encoder.layer.{i}"
        for ours, theirs in (("self_attention", "attention"), ("cross_attention", "crossattention")):
            for name in ("query", "key", "value"):
                kernel = t(layer[ours][name]["kernel"])
                state[f"{prefix}.{theirs}.self.{name}.weight"] = kernel.reshape(kernel.shape[0], -1).T
                state[f"{prefix}.{theirs}.self.{name}.bias"] = t(layer[ours][name]["bias"]).reshape(-1)
            out = t(layer[ours]["out"]["kernel"])
            state[f"{prefix}.{theirs}.output.dense.weight"] = out.reshape(-1, out.shape[-1]).T
            state[f"{prefix}.{theirs}.output.dense.bias"] = t(layer[ours]["out"]["bias"])
            state[f"{prefix}.{theirs}.output.LayerNorm.weight"] = t(layer[f"{ours}_norm"]["scale"])
            state[f"{prefix}.{theirs}.output.LayerNorm.bias"] = t(layer[f"{ours}_norm"]["bias"])
        for ours, theirs in (("wi", "intermediate.dense"), ("wo", "output.dense")):
            state[f"{prefix}.{theirs}.weight"] = t(layer["mlp"][ours]["kernel"]).T
            state[f"{prefix}.{theirs}.bias"] = t(layer["mlp"][ours]["bias"])
        state[f"{prefix}.output.LayerNorm.weight"] = t(layer["mlp_norm"]["scale"])
        state[f"{prefix}.output.LayerNorm.bias"] = t(layer["mlp_norm"]["bias"])
    return state


@pytest.mark.parametrize("side", ["previous", "next"])
def test_a_decoder_equals_hugging_face_berts_causal_decoder_cross_attending_to_the_vector(side):
    torch = pytest.importorskip("torch", reason="the reference decoder is Hugging Face's torch BertModel")
    transformers = pytest.importorskip("transformers", reason="the reference decoder is Hugging Face's BertModel")
    _, module, params = _model()
    params = nn.meta.unbox(params)
    config = transformers.BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64, hidden_act="gelu",
                                     layer_norm_eps=1e-12, is_decoder=True, add_cross_attention=True)
    hf = transformers.BertModel(config, add_pooling_layer=False).eval()
    state = _hf_state(params[f"{side}_decoder"])
    hf.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()}, strict=True)
    rng = np.random.RandomState(3)
    vectors = rng.normal(size=(3, 64)).astype(np.float32)
    tokens = rng.randint(1, 300, size=(3, 9)).astype(np.int32)
    ours = module.apply({"params": params}, jnp.asarray(vectors), jnp.asarray(tokens), side, method="decode")
    with torch.no_grad():
        hidden = hf(input_ids=torch.from_numpy(tokens).long(), encoder_hidden_states=torch.from_numpy(vectors)[:, None],
                    encoder_attention_mask=torch.ones(3, 1)).last_hidden_state.numpy()
    # t5lite's BERT LM head: the tied token embedding, no transform or bias
    assert_close(np.asarray(ours), hidden @ state["embeddings.word_embeddings.weight"].T, rtol=1e-4)


def test_neighbour_targets_mask_batch_and_paragraph_edges():
    batch = _batch([0, 0, 1, 1, 1, 2])
    tokens, paragraph = batch["text0_input_tokens"], batch["paragraph"]
    real = np.asarray(tokens)[:, 1:] != 0
    for offset, has in ((-1, [0, 1, 0, 1, 1, 0]), (1, [1, 0, 1, 1, 0, 0])):
        inputs, targets, weights = map(np.asarray, neighbour_targets(tokens, paragraph, offset))
        for i, flag in enumerate(has):
            if flag:
                np.testing.assert_array_equal(inputs[i], np.asarray(tokens)[i + offset, :-1])
                np.testing.assert_array_equal(targets[i], np.asarray(tokens)[i + offset, 1:])
                np.testing.assert_array_equal(weights[i], real[i + offset])
            else:
                assert not weights[i].any()


def test_a_sentence_alone_in_its_paragraph_adds_no_loss():
    objective, module, params = _model()
    batch = _batch([0, 0, 0, 1])
    other = dict(batch, text0_input_tokens=batch["text0_input_tokens"].at[3, 1:4].set(jnp.array([7, 8, 9])))
    loss, _ = _loss(objective, module, params, batch)
    assert float(_loss(objective, module, params, other)[0]) == float(loss)
    # in one paragraph, the last sentence is the third's next one, and its vector predicts the third
    same = dict(batch, paragraph=jnp.zeros_like(batch["paragraph"]))
    changed = dict(same, text0_input_tokens=other["text0_input_tokens"])
    assert float(_loss(objective, module, params, same)[0]) != float(_loss(objective, module, params, changed)[0])


def test_gradients_reach_the_encoder_through_the_sentence_vector():
    objective, module, params = _model()
    batch = _batch([0, 0, 0, 0])
    grads = jax.jit(jax.grad(lambda p: _loss(objective, module, p, batch)[0]))(params)
    norms = {k: float(optax.global_norm(v)) for k, v in grads.items()}
    assert set(norms) == {"token_embedder", "encoder", "previous_decoder", "next_decoder"}
    assert all(n > 0 and np.isfinite(n) for n in norms.values()), norms
    # the encoder's gradient is the decoders' cross-attention reading the vector: none without it
    frozen = jax.jit(jax.grad(lambda p: _loss(objective, module, {**p, "encoder": jax.lax.stop_gradient(p["encoder"])},
                                              batch)[0]))(params)
    assert float(optax.global_norm(frozen["encoder"])) == 0.0


def _train(run, steps):
    cli.main(["train", f"--gin_file={CONFIG}", f"--gin.MODEL_DIR='{run}'", "--gin.DATA_DIR=None",
              "--gin.MIXTURE_OR_TASK_NAME='embedded_docs_lines'", "--gin.TASK_FEATURE_LENGTHS={'text0': 32}",
              "--gin.BATCH_SIZE=8", f"--gin.TRAIN_STEPS={steps}", "--gin.train.log_every=1",
              "--gin.train.checkpoint_every=2", "--gin.warmup_cosine.warmup_steps=1"])
    gin.clear_config()
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def test_config_trains_bert_tiny_resumes_and_t5lite_embed_reads_its_encoder(tmp_path):
    run = str(tmp_path / "st")
    first = _train(run, 2)
    resumed = _train(run, 4)      # continues from the checkpoint at step 2
    assert sorted(first) == [1, 2] and sorted(resumed) == [1, 2, 3, 4]
    assert np.isfinite(list(resumed.values())).all()
    # an untrained decoder: about log(2176) per token
    assert first[1] == pytest.approx(np.log(2176), rel=0.1)
    params = ocp.StandardCheckpointer().restore(os.path.join(run, "checkpoints", "4", "state"))["params"]
    assert {"previous_decoder", "next_decoder"} <= set(params)
    assert_embed_reads_run(run, CONFIG, tmp_path, 64)


def test_train_flops_match_the_parameter_shapes():
    """6 x (each matmul kernel's size x the tokens it is applied to) + 12 x q_len x kv_len x width per
    attention (halved if causal): the encoder reads L tokens, each decoder L - 1 and a memory of one."""
    objective, module, _ = _model()
    length = 24
    params = nn.meta.unbox(jax.eval_shape(lambda: module.init(
        jax.random.key(0), **objective.init_features({"text0_input_tokens": length}))))["params"]
    config = module.config
    macs = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        name = jax.tree_util.keystr(path)
        decoder = "_decoder']" in name
        if decoder and "token_embedder" in name:   # the tied output layer
            macs += leaf.size * (length - 1)
        elif name.endswith("['kernel']"):
            reads_memory = "cross_attention']['key" in name or "cross_attention']['value" in name
            macs += leaf.size * (1 if reads_memory else length - 1 if decoder else length)
    width = config.num_heads * config.head_dim
    attention = config.num_encoder_layers * (length * length + 2 * ((length - 1) ** 2 / 2 + (length - 1)))
    expected = 6 * macs + 12 * attention * width
    assert objective.train_flops_per_example(config, {"text0_input_tokens": length, "label": 1, "paragraph": 1}) \
        == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("objective", [SkipThoughtObjective(), QuickThoughtObjective()], ids=repr)
def test_t5lite_eval_scores_a_sentence_pair_task_and_the_training_corpus_has_nothing_to_score(objective):
    glue = str(shared_data_dir() / "glue")
    stsb = catalog.get_task_or_mixture("sentence_stsb")
    evaluators = objective.evaluators(stsb, "validation", {"text0": 32, "text1": 32}, data_dir=glue, max_examples=8)
    assert [type(e).__name__ for e in evaluators.values()] == ["SentenceEvaluator"]
    assert objective.evaluators(catalog.get_task_or_mixture("wikitext2"), "validation", {"text0": 32}) == {}
