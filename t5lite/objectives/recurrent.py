"""The recurrent families' objectives (train with the word converters of t5lite.data.word_converters,
`train.pack = False`):

- `BiLMObjective`: ELMo's pre-training, the forward and the backward LM's cross entropy over one
  word softmax, averaged (bilm-tf); full, or sampled in training (`num_sampled`); `word_lm_chars`.
- `AWDLSTMLMObjective`: ULMFiT's LM pre-training and target-domain fine-tuning (the same objective
  on the task's text, `train.initial_checkpoint_path` = the pre-trained run); `word_lm`.
- `RecurrentClassificationObjective`: ULMFiT's classifier (`backbone="awd_lstm"`, the encoder grafted
  from an LM run), a frozen ELMo + scalar mix + small task model (`backbone="elmo"`, the biLM
  grafted from a `BiLMObjective` run) or frozen static vectors + the same task model
  (`backbone="static"`, GloVe / word2vec from `word_vectors`); `word_classification(_chars)`.

LM runs log `perplexity` (exp of the mean token loss) and evaluate validation perplexity.
"""
from __future__ import annotations

import functools
import itertools
from typing import Any, Mapping

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax

from t5lite import finite
from t5lite.data import converter_registry, converters
from t5lite.data.word_vectors import load_word_vectors
from t5lite.data.word_vocab import word_vocabulary
from t5lite.errors import ConfigError, DataError
from t5lite.infer import checkpoint_reader, classify
from t5lite.infer.evaluation import EvalResult
from t5lite.models import flops
from t5lite.models.awd_lstm import AWDLSTMClassifier, AWDLSTMLanguageModel
from t5lite.models.feature_classifier import FrozenELMoClassifier, FrozenStaticClassifier
from t5lite.models.recurrent import BiLMLanguageModel
from t5lite.models.recurrent_config import AWDLSTMConfig, BiLMConfig
from t5lite.models.running_statistics import RUNNING_STATISTICS, sown_values
from t5lite.objectives.base import LossConfig, Objective
from t5lite.objectives.heldout import converted_rows


def _check_config(config, expected: type, objective: str):
    if not isinstance(config, expected):
        preset = "elmo_tiny" if expected is BiLMConfig else "awd_lstm_tiny"
        raise ConfigError(f"{objective} trains a {expected.__name__}; got a {type(config).__name__}: set "
                          f"model_config.preset to one of its presets (e.g. '{preset}')")
    size = word_vocabulary().vocab_size
    if size > config.vocab_size:
        raise ConfigError(f"the word vocabulary has {size} ids but the model's softmax has {config.vocab_size}: set "
                          f"model_config.vocab_size = {size} or a smaller word_vocabulary.size")


def log_uniform_sample(rng, num_sampled: int, range_max: int):
    """`num_sampled` ids in [0, range_max) drawn with replacement from TF's log-uniform (Zipfian)
    candidate sampler, P(k) = log((k + 2) / (k + 1)) / log(range_max + 1) (a vocabulary sorted
    by falling frequency), and log P of each."""
    u = jax.random.uniform(rng, (num_sampled,))
    ids = jnp.clip(jnp.floor(jnp.exp(u * jnp.log(range_max + 1.0))) - 1, 0, range_max - 1).astype(jnp.int32)
    return ids, log_uniform_log_prob(ids, range_max)


def log_uniform_log_prob(ids, range_max: int):
    ids = ids.astype(jnp.float32)
    return jnp.log(jnp.log((ids + 2.0) / (ids + 1.0)) / jnp.log(range_max + 1.0))


def sampled_softmax_losses(hidden, kernel, bias, targets, sampled, sampled_log_prob, num_sampled: int):
    """Per-position sampled softmax cross entropy (Jean et al., 2015; tf.nn.sampled_softmax_loss with
    replacement and accidental hits removed): the true word against the shared sampled words, each
    logit minus log(num_sampled * P(word)). hidden [..., d], targets [...] -> [...]."""
    true_logits = jnp.sum(hidden * kernel.T[targets], -1) + bias[targets]
    true_logits = true_logits - (jnp.log(num_sampled) + log_uniform_log_prob(targets, kernel.shape[1]))
    sampled_logits = hidden @ kernel[:, sampled] + bias[sampled] - (jnp.log(num_sampled) + sampled_log_prob)
    sampled_logits = jnp.where(sampled == targets[..., None], -1e30, sampled_logits)
    logits = jnp.concatenate([true_logits[..., None], sampled_logits], -1)
    return -jax.nn.log_softmax(logits)[..., 0]


def _shifted(values, tokens, direction: str):
    """(the positions' values, their targets, weights) of one direction's predictions."""
    weights = (tokens[:, 1:] != 0).astype(jnp.float32)    # both: the pair (t, t + 1) lies in the sentence
    if direction == "forward":
        return values[:, :-1], tokens[:, 1:], weights
    return values[:, 1:], tokens[:, :-1], weights


def lm_token_losses(logits, tokens, direction: str):
    """(summed cross entropy, summed correct, count) of one direction's next-word predictions;
    `tokens` [B, T] word ids, 0 after each sentence."""
    logits, targets, weights = _shifted(logits, tokens, direction)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
    return jnp.sum(ce * weights), jnp.sum(correct * weights), jnp.sum(weights)


class _WordObjective(Objective):
    """The word-level models read t5lite.data.word_vocab ids, not the task's subword ids."""
    produces_text = False

    def embedding_rows(self, config):
        return None


class _WordLMObjective(_WordObjective):
    """What both LMs share: the word features, per-prediction normalising, perplexity."""
    directions: tuple[str, ...] = ("forward",)
    converter = "word_lm"
    loss_label = "cross entropy per target word"

    def init_features(self, feature_lengths: Mapping[str, int]) -> dict[str, Any]:
        return {k: jnp.ones((1, n), jnp.int32) for k, n in feature_lengths.items()}

    def normalizers(self, batch, loss: LossConfig) -> dict[str, Any]:
        predictions = jnp.sum(batch["encoder_input_tokens"][:, 1:] != 0).astype(jnp.float32)
        return {"predictions": jnp.maximum(predictions * len(self.directions), 1.0)}

    def logits(self, module, params, batch, rng):
        inputs = {k: batch[k] for k in ("encoder_input_tokens", "encoder_input_chars") if k in batch}
        if rng is None:
            out = module.apply({"params": params}, **inputs)
        else:
            out = module.apply({"params": params}, **inputs, enable_dropout=True, rngs={"dropout": rng})
        return out if isinstance(out, tuple) else (out,)

    def loss_and_metrics(self, module, params, batch, rng, normalizers, loss):
        return self.lm_loss(self.logits(module, params, batch, rng), batch["encoder_input_tokens"], normalizers)

    def lm_loss(self, outputs, tokens, normalizers):
        """(the normalised cross entropy, metrics) of each direction's logits in `outputs`."""
        total, correct, metrics = 0.0, 0.0, {}
        for direction, logits in zip(self.directions, outputs):
            ce, right, n = lm_token_losses(logits, tokens, direction)
            total, correct = total + ce, correct + right
            if len(self.directions) > 1:
                metrics[f"{direction}_loss"] = (ce, n)
        n = n * len(self.directions)
        metrics.update(loss=(total, n), accuracy=(correct, n), target_tokens=n)
        return total / normalizers["predictions"], metrics

    def derived_metrics(self, metrics: dict) -> dict:
        """Perplexities from the mean losses."""
        out = dict(metrics)
        for key in [k for k in metrics if k.endswith("loss") and not k.endswith("z_loss")]:
            out[key[:-4] + "perplexity"] = jnp.exp(metrics[key])
        return out

    def forward_flops_per_example(self, config, length: int) -> float:
        """One sentence's forward over its `length` words, as evaluation runs it: the encoder and the
        full word softmax (each direction's) at every word (t5lite.models.flops)."""
        return 2 * flops.recurrent_lm_macs_per_word(config) * length

    def evaluators(self, task, split, task_feature_lengths, batch_size=32, data_dir=None, max_examples=None, **_):
        return {task.name: PerplexityEvaluator(self, task, split, task_feature_lengths, batch_size, data_dir,
                                               max_examples)}


class PerplexityEvaluator:
    """Validation perplexity of an LM objective over a split (each direction and overall); its
    FLOPs are the objective's `forward_flops_per_example` at each sentence's words (padding and
    the filler rows of a short batch left out)."""

    def __init__(self, objective: _WordLMObjective, task, split, task_feature_lengths, batch_size: int = 32,
                 data_dir=None, max_examples=None):
        self.objective, self.task, self.split = objective, task, split
        rows, self.examples = converted_rows(objective.converter, task, split, task_feature_lengths, data_dir,
                                             max_examples)
        self.lengths = [int(np.count_nonzero(row["encoder_input_tokens"])) for row in rows]
        batches = converters.batch(rows, batch_size, drop_remainder=False)
        self.batches = [classify._fill({k: v for k, v in b.items() if k != converters.EXAMPLES_KEY}, batch_size)
                        for b in batches]

    def evaluate(self, module, params) -> EvalResult:
        sums = [jax.device_get(_eval_sums(self.objective, module, params, b)) for b in self.batches]
        totals = {k: sum(float(s[k][0]) for s in sums) for k in sums[0]}
        count = sum(float(s["loss"][1]) for s in sums)
        per_direction = count / len(self.objective.directions)
        losses = {"loss": totals["loss"] / count,
                  **{k: totals[k] / per_direction for k in totals if k.endswith("_loss")}}
        done = sum(self.objective.forward_flops_per_example(module.config, n) for n in self.lengths)
        return EvalResult({**perplexities(losses), "loss": losses["loss"]}, [], flops=done, examples=self.examples)


def perplexities(losses: Mapping[str, float]) -> dict[str, float]:
    """The exps of mean cross entropies (`loss`, `forward_loss`: `perplexity`, `forward_perplexity`);
    refused unless all are finite, as a diverged LM's are not (a NaN loss, or one so large that its
    exp overflows)."""
    with np.errstate(over="ignore"):
        out = {k[:-4] + "perplexity": float(np.exp(v)) for k, v in losses.items()}
    finite.require_finite(list(out.values()), "perplexities")
    return out


@functools.partial(jax.jit, static_argnums=(0, 1))
def _eval_sums(objective, module, params, batch):
    _, metrics = objective.loss_and_metrics(module, params, batch, None, {"predictions": 1.0}, None)
    return {k: v for k, v in metrics.items() if isinstance(v, tuple)}


@gin.configurable
class BiLMObjective(_WordLMObjective):
    """`num_sampled` > 0 trains with a sampled softmax of that many log-uniform samples per step
    (bilm-tf: 8192), shared by the batch; the logged training loss (and perplexity) is then the
    sampled one, the evaluation's always the full softmax's."""
    directions = ("forward", "backward")
    converter = "word_lm_chars"

    def __init__(self, num_sampled: int = 0):
        self.num_sampled = num_sampled

    def __repr__(self):
        return f"BiLMObjective(num_sampled={self.num_sampled})"

    def loss_and_metrics(self, module, params, batch, rng, normalizers, loss):
        if not self.num_sampled or rng is None:
            return super().loss_and_metrics(module, params, batch, rng, normalizers, loss)
        tokens = batch["encoder_input_tokens"]
        dropout_rng, sample_rng = jax.random.split(rng)
        states = module.apply({"params": params}, tokens, batch["encoder_input_chars"], enable_dropout=True,
                              logits=False, rngs={"dropout": dropout_rng})
        sampled, log_prob = log_uniform_sample(sample_rng, self.num_sampled, module.config.vocab_size)
        total, metrics = 0.0, {}
        for direction, hidden in zip(self.directions, states):
            hidden, targets, weights = _shifted(hidden, tokens, direction)
            ce = jnp.sum(weights * sampled_softmax_losses(hidden, params["softmax_kernel"], params["softmax_bias"],
                                                          targets, sampled, log_prob, self.num_sampled))
            total = total + ce
            metrics[f"{direction}_loss"] = (ce, jnp.sum(weights))
        n = 2 * jnp.sum(weights)
        metrics.update(loss=(total, n), target_tokens=n)
        return total / normalizers["predictions"], metrics

    def build_model(self, config):
        _check_config(config, BiLMConfig, "BiLMObjective")
        return BiLMLanguageModel(config)


def activation_regularisers(raw_top, dropped_top, tokens):
    """AWD-LSTM's activation regularisers (Merity et al., 2017, section 4.6; fastai's
    `RNNRegularizer`) over each row's real steps, as (sum, count) pairs: AR, the squares of the top
    layer's output after its dropout; TAR, the squares of its raw output's change from step t to
    t + 1 (both in the sentence). sum / count is fastai's `.pow(2).mean()` of each."""
    valid = (tokens != 0)[..., None]
    pairs = valid[:, 1:] & valid[:, :-1]
    width = raw_top.shape[-1]
    ar = jnp.sum(jnp.where(valid, dropped_top ** 2, 0.0)), jnp.sum(valid) * width
    tar = jnp.sum(jnp.where(pairs, (raw_top[:, 1:] - raw_top[:, :-1]) ** 2, 0.0)), jnp.sum(pairs) * width
    return ar, tar


@gin.configurable
class AWDLSTMLMObjective(_WordLMObjective):
    """The next-word cross entropy plus, in training, AWD-LSTM's activation regularisation
    `alpha` * AR and temporal activation regularisation `beta` * TAR (`activation_regularisers`;
    fastai's defaults 2 and 1). They keep the top LSTM's output small and smooth: without them a
    tied-decoder LM learns the unigram distribution by driving the top layer to the same
    saturated output for every word (gates past +-4, cells growing along the sentence), a state
    no gradient leaves, so the LM stops at unigram perplexity and its layers carry nothing a
    classifier can use. The logged `loss` stays the cross entropy alone.

    `stream_rows` = the batch size (gin/objectives/awd_lstm_lm.gin sets it, with the
    `word_lm_stream` converter) makes the LM stateful as fastai's: each row reads S words of one
    stream and predicts the next S, starting from the state (detached) its row ended the last batch
    with, reset at a stream's start; validation perplexity is taken the same way over one stream of
    the split. 0: each row is one sentence read from a zero state (the `word_lm` converter)."""
    converter = "word_lm"

    def __init__(self, alpha: float = 2.0, beta: float = 1.0, stream_rows: int = 0):
        self.alpha, self.beta, self.stream_rows = alpha, beta, stream_rows
        if stream_rows:
            self.converter = "word_lm_stream"

    def __repr__(self):
        return f"AWDLSTMLMObjective(alpha={self.alpha}, beta={self.beta}, stream_rows={self.stream_rows})"

    def _inputs(self, batch):
        """(tokens the LM reads, their next words' count per row): a stream row's last id is a target only."""
        tokens = batch["encoder_input_tokens"]
        if not self.stream_rows:
            return tokens
        if "reset_state" not in batch:
            raise ConfigError("AWDLSTMLMObjective(stream_rows > 0) reads the 'word_lm_stream' converter's batches: "
                              "set train.feature_converter = 'word_lm_stream', or AWDLSTMLMObjective.stream_rows = 0")
        return tokens[:, :-1]

    def init_features(self, feature_lengths):
        features = super().init_features(feature_lengths)
        if self.stream_rows:
            features = {"encoder_input_tokens": jnp.ones((self.stream_rows, 2), jnp.int32),
                        "reset_state": jnp.ones((self.stream_rows, 1), jnp.int32)}
        return features

    def normalizers(self, batch, loss: LossConfig) -> dict[str, Any]:
        tokens = self._inputs(batch)
        return {**super().normalizers(batch, loss),
                "steps": jnp.maximum(jnp.sum(tokens != 0), 1).astype(jnp.float32),
                "step_pairs": jnp.maximum(jnp.sum((tokens[:, 1:] != 0) & (tokens[:, :-1] != 0)), 1).astype(jnp.float32)}

    def apply(self, module, params, batch, rng, initial_state=None):
        """(logits of every read position, sown collections) of one batch."""
        kwargs = {} if rng is None else {"enable_dropout": True, "rngs": {"dropout": rng}}
        if self.stream_rows:
            kwargs.update(reset_state=batch["reset_state"], initial_state=initial_state)
        return module.apply({"params": params}, self._inputs(batch), **kwargs,
                            mutable=["intermediates", RUNNING_STATISTICS])

    def stream_loss(self, logits, batch, normalizers):
        """`lm_loss` of a stream batch: logits [B, S] of its inputs against its ids 1..S."""
        targets = batch["encoder_input_tokens"][:, 1:]
        ce = jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets))
        correct = jnp.sum((jnp.argmax(logits, -1) == targets).astype(jnp.float32))
        n = jnp.asarray(targets.size, jnp.float32)
        return ce / normalizers["predictions"], {"loss": (ce, n), "accuracy": (correct, n), "target_tokens": n}

    def loss_and_metrics(self, module, params, batch, rng, normalizers, loss):
        tokens = self._inputs(batch)
        logits, state = self.apply(module, params, batch, rng)
        if self.stream_rows:
            value, metrics = self.stream_loss(logits, batch, normalizers)
            metrics[RUNNING_STATISTICS] = sown_values(state[RUNNING_STATISTICS])
        else:
            value, metrics = self.lm_loss((logits,), tokens, normalizers)
        if rng is None or not (self.alpha or self.beta):
            return value, metrics
        raw, dropped = state["intermediates"]["raw_top"][0], state["intermediates"]["dropped_top"][0]
        (ar, ar_n), (tar, tar_n) = activation_regularisers(raw, dropped, tokens)
        width = raw.shape[-1]   # the means are over the whole batch's steps (normalizers), as the loss's
        value = (value + self.alpha * ar / (normalizers["steps"] * width)
                 + self.beta * tar / (normalizers["step_pairs"] * width))
        metrics.update(activation_reg=(ar, ar_n), temporal_activation_reg=(tar, tar_n))
        return value, metrics

    def build_model(self, config):
        _check_config(config, AWDLSTMConfig, "AWDLSTMLMObjective")
        return AWDLSTMLanguageModel(config, self.stream_rows)

    def initial_params(self, path, abstract_params):
        """The LM run's params but its carried state (that of a stream this run does not continue)."""
        kept = {k: v for k, v in abstract_params.items() if not k.startswith("carried_state")}
        restored = checkpoint_reader.restore_params(path, kept)
        return {k: restored.get(k) for k in abstract_params}

    def evaluators(self, task, split, task_feature_lengths, batch_size=32, data_dir=None, max_examples=None, **_):
        if not self.stream_rows:
            return super().evaluators(task, split, task_feature_lengths, batch_size, data_dir, max_examples)
        return {task.name: StreamPerplexityEvaluator(self, task, split, task_feature_lengths, batch_size, data_dir,
                                                     max_examples)}


class StreamPerplexityEvaluator:
    """A stateful LM's validation perplexity as fastai takes it: the split's first `max_examples`
    examples in order as one `word_lm_stream` stream of `batch_size` rows, the state reset at its
    start and carried from batch to batch."""

    def __init__(self, objective: AWDLSTMLMObjective, task, split, task_feature_lengths, batch_size: int = 32,
                 data_dir=None, max_examples=None):
        self.objective = objective
        examples = list(itertools.islice(task.get_dataset(split, task_feature_lengths, data_dir=data_dir),
                                         max_examples))
        self.examples = len(examples)
        converter = converter_registry.get_feature_converter("word_lm_stream", stream_examples=None)
        rows = list(converter.convert(examples, task_feature_lengths))
        if not rows:
            raise DataError(f"task {task.name!r} has no examples in split {split!r} (data_dir={data_dir!r})")
        self.batches = [{k: v for k, v in b.items() if k != converters.EXAMPLES_KEY}
                        for b in converter.batch(rows, batch_size)]

    def evaluate(self, module, params) -> EvalResult:
        rows, loss, count = self.batches[0]["encoder_input_tokens"].shape[0], 0.0, 0.0
        state = [(jnp.zeros((rows, width)),) * 2 for _, width in module.config.layer_dims()]
        for batch in self.batches:
            (total, n), state = jax.device_get(_stream_eval(self.objective, module, params, batch, state))
            loss, count = loss + float(total), count + float(n)
        length = self.batches[0]["encoder_input_tokens"].shape[1] - 1
        done = count / length * self.objective.forward_flops_per_example(module.config, length)
        return EvalResult({**perplexities({"loss": loss / count}), "loss": loss / count}, [], flops=done,
                          examples=self.examples)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _stream_eval(objective, module, params, batch, state):
    """((summed cross entropy, count), final state) of one stream batch from `state`."""
    logits, sown = objective.apply(module, params, batch, None, state)
    _, metrics = objective.stream_loss(logits, batch, {"predictions": 1.0})
    final = sown_values(sown[RUNNING_STATISTICS])
    layers = range(module.config.n_layers)
    return metrics["loss"], [(final[f"carried_state_{k}_c"], final[f"carried_state_{k}_h"]) for k in layers]


def _padded_table(table: np.ndarray, key, shape, dtype=jnp.float32):
    """The static table as a parameter init, zero rows up to the model's vocabulary size."""
    return jnp.zeros(shape, dtype).at[:table.shape[0]].set(table)


class WordClassificationEvaluator(classify.ClassificationEvaluator):
    """Accuracy (the task's metrics) of a word-level classifier; `example_flops(config, words)` counts
    one example's forward (the objective's `forward_flops_per_example`)."""

    def __init__(self, *args, chars: bool = False, example_flops=None, **kwargs):
        self.converter = "word_classification_chars" if chars else "word_classification"
        self.model_inputs = ("encoder_input_tokens", "encoder_input_chars") if chars else ("encoder_input_tokens",)
        self.example_flops = example_flops
        super().__init__(*args, **kwargs)

    def forward_flops(self, module) -> float:
        if self.example_flops is None:
            return 0.0
        return sum(self.example_flops(getattr(module, "config", None), n) for n in self.used_lengths)


BACKBONES = ("awd_lstm", "elmo", "static")


def static_table(path: str, words: tuple[str, ...]) -> np.ndarray:
    """[len(words) + 1, dim] float32: row i is the vectors file's vector of word id i (`words[i - 1]`,
    tried as written, then lowercased: GloVe's are); padding and words it lacks get zeros."""
    vectors = _word_vectors(path)
    table = np.zeros((len(words) + 1, vectors.vectors.shape[1]), np.float32)
    for i, word in enumerate(words, start=1):
        if (vector := vectors.vector_of(word)) is not None:
            table[i] = vector
    return table


@functools.lru_cache(maxsize=2)
def _word_vectors(path: str):
    return load_word_vectors(path)


@gin.configurable
class RecurrentClassificationObjective(_WordObjective):
    """Cross entropy on `label` of ULMFiT's classifier (`backbone="awd_lstm"`), of a frozen ELMo's
    scalar mix + `task_model` ("bilstm" or "linear"; `backbone="elmo"`), or of frozen static word
    vectors + `task_model` (`backbone="static"`: `word_vectors` is a word2vec or GloVe file, its
    rows looked up for the word vocabulary; the model config only gives the vocabulary size)."""
    loss_label = "cross entropy per example"

    def __init__(self, num_labels: int = 2, backbone: str = "awd_lstm", task_model: str = "bilstm", hidden: int = 50,
                 word_vectors: str | None = None):
        if backbone not in BACKBONES:
            raise ConfigError(f"RecurrentClassificationObjective.backbone={backbone!r}: expected one of {BACKBONES}")
        if (backbone == "static") != (word_vectors is not None):
            raise ConfigError("RecurrentClassificationObjective.word_vectors (a word2vec or GloVe file) goes with "
                              f"backbone='static' and only with it; got backbone={backbone!r}, "
                              f"word_vectors={word_vectors!r}")
        self.num_labels, self.backbone, self.task_model, self.hidden = num_labels, backbone, task_model, hidden
        self.word_vectors = word_vectors

    def __repr__(self):
        return (f"RecurrentClassificationObjective(num_labels={self.num_labels}, backbone={self.backbone!r}, "
                f"task_model={self.task_model!r}, hidden={self.hidden}, word_vectors={self.word_vectors!r})")

    @property
    def chars(self) -> bool:
        return self.backbone == "elmo"

    def build_model(self, config):
        if self.backbone == "elmo":
            _check_config(config, BiLMConfig, "RecurrentClassificationObjective(backbone='elmo')")
            return FrozenELMoClassifier(config, self.num_labels, self.task_model, self.hidden)
        _check_config(config, AWDLSTMConfig, f"RecurrentClassificationObjective(backbone={self.backbone!r})")
        if self.backbone == "static":
            table = static_table(self.word_vectors, tuple(word_vocabulary().words))
            return FrozenStaticClassifier(config.vocab_size, table.shape[1], functools.partial(_padded_table, table),
                                          self.num_labels, self.task_model, self.hidden)
        return AWDLSTMClassifier(config, self.num_labels, self.hidden)

    def _macs(self, config, length: int) -> tuple[float, float]:
        """(backbone, own model) MACs of one example of `length` words (t5lite.models.flops): ULMFiT's
        encoder, ELMo's biLM (char CNN, both LSTM directions) or nothing for a static table; then the
        task model (ELMo, static: BiLSTM or none) and the pooled head. No word softmax runs."""
        if self.backbone == "static":
            backbone, features, task_model = 0.0, _word_vectors(self.word_vectors).vectors.shape[1], self.task_model
        else:
            backbone = flops.recurrent_encoder_macs_per_word(config) * length
            features = flops.recurrent_features(config)
            task_model = self.task_model if self.backbone == "elmo" else None
        return backbone, flops.pooled_classifier_macs(features, length, task_model, self.hidden, self.num_labels)

    def forward_flops_per_example(self, config, length: int) -> float:
        """One example's forward over `length` words, as evaluation runs it."""
        return 2 * sum(self._macs(config, length))

    def train_flops_per_example(self, config, feature_lengths):
        """Forward + backward of what trains (ULMFiT's encoder and every classifier's own model, 3x
        the forward), the forward alone of a frozen backbone (ELMo's biLM, 1x)."""
        backbone, own = self._macs(config, feature_lengths["encoder_input_tokens"])
        return 2 * ((3 if self.backbone == "awd_lstm" else 1) * backbone + 3 * own)

    def init_features(self, feature_lengths):
        keys = ("encoder_input_tokens", "encoder_input_chars") if self.chars else ("encoder_input_tokens",)
        return {k: jnp.ones((1, feature_lengths[k]), jnp.int32) for k in keys}

    def normalizers(self, batch, loss):
        return {"examples": jnp.asarray(batch["label"].shape[0], jnp.float32)}

    def loss_and_metrics(self, module, params, batch, rng, normalizers, loss):
        inputs = {k: batch[k] for k in self.init_features(dict.fromkeys(batch, 0))}
        logits, state = module.apply({"params": params}, **inputs, enable_dropout=True, rngs={"dropout": rng},
                                     mutable=[RUNNING_STATISTICS])
        labels = batch["label"].reshape(-1)
        per_example = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        n = jnp.asarray(labels.shape[0], jnp.float32)
        correct = jnp.sum(jnp.argmax(logits, -1) == labels).astype(jnp.float32)
        metrics = {"loss": (jnp.sum(per_example), n), "accuracy": (correct, n), "examples": n}
        if state.get(RUNNING_STATISTICS):     # the head's BatchNorm statistics (the trainer stores them)
            metrics[RUNNING_STATISTICS] = sown_values(state[RUNNING_STATISTICS])
        return jnp.sum(per_example) / normalizers["examples"], metrics

    def initial_params(self, path, abstract_params):
        if self.backbone == "static":
            raise ConfigError("RecurrentClassificationObjective(backbone='static') reads its table from "
                              "word_vectors; set train.initial_checkpoint_path = None")
        """The LM run's encoder (AWD-LSTM) or biLM (ELMo); the rest keeps its fresh init."""
        part = "bilm" if self.chars else "encoder"
        grafted = checkpoint_reader.restore_params(path, {part: abstract_params[part]})
        return {k: grafted[part] if k == part else None for k in abstract_params}

    def evaluators(self, task, split, task_feature_lengths, **kwargs):
        return {task.name: WordClassificationEvaluator(task, split, task_feature_lengths, chars=self.chars,
                                                       example_flops=self.forward_flops_per_example, **kwargs)}
