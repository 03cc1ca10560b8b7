"""ULMFiT's AWD-LSTM (Merity et al., 2017; Howard and Ruder, 2018) as fastai builds it: a word
embedding, a stack of plain LSTMs (torch.nn.LSTM's gates: input, forget, cell, output) and the
dropouts that regularise it: embedding dropout (whole rows of the table), variational ("locked")
dropout with one mask per sequence on the embeddings, between layers and on the output, and
weight dropout (DropConnect) on each LSTM's hidden-to-hidden matrix, one mask per forward pass.

`AWDLSTMLanguageModel` adds the decoder (tied to the embedding) for LM pre-training and target-domain
fine-tuning; `AWDLSTMClassifier` fastai's concat-pooling classifier ([last, max, mean] of the top layer
-> BatchNorm, dropout, 50 ReLUs -> BatchNorm, dropout, classes). Both keep the encoder in
`params["encoder"]` so a fine-tuned LM's encoder starts the classifier.

Initialised as fastai / torch: LSTMs as torch.nn.LSTM (two biases, b_ih and b_hh, every array
U(+-1/sqrt(hidden))), the embedding U(-0.1, 0.1), the head's BatchNorms scale 1 and bias 1e-3
(fastai.layers.BatchNorm) and its linear layers torch.nn.Linear's U(+-1/sqrt(fan in)).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.errors import ConfigError
from t5lite.models.layers import param_with_axes
from t5lite.models.recurrent import masked_scan, reverse_within_lengths
from t5lite.models.recurrent_config import AWDLSTMConfig
from t5lite.models.running_statistics import RUNNING_STATISTICS


def torch_lstm_step(params: dict, hidden_kernel, carry, x):
    """One step of torch.nn.LSTM: carry (c, h) [B, hidden]; kernels [in or hidden, 4 * hidden]."""
    c, h = carry
    z = x @ params["input_kernel"] + h @ hidden_kernel + params["input_bias"] + params["hidden_bias"]
    i, f, g, o = jnp.split(z, 4, axis=-1)
    c = nn.sigmoid(f) * c + nn.sigmoid(i) * jnp.tanh(g)
    return c, nn.sigmoid(o) * jnp.tanh(c)


def locked_dropout(module: nn.Module, x, rate: float, enabled: bool):
    """Variational dropout of x [B, T, D]: one mask per sequence, the same at every step."""
    if not enabled or rate == 0.0:
        return x
    keep = jax.random.bernoulli(module.make_rng("dropout"), 1.0 - rate, (x.shape[0], 1, x.shape[2]))
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def _uniform(scale: float):
    """U(-scale, scale), torch's LSTM init and fastai's embedding init."""
    return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -scale, scale)


def torch_linear_init(key, shape, dtype=jnp.float32):
    """torch.nn.Linear's default weight init (kaiming_uniform_, a=sqrt(5)): U(+-1/sqrt(fan in)) of an
    [in, out] kernel."""
    return _uniform(1.0 / shape[0] ** 0.5)(key, shape, dtype)


def lengths_of(tokens):
    """Real tokens per row (pad id 0 after them)."""
    return jnp.sum(tokens != 0, axis=-1).astype(jnp.int32)


class WeightDropLSTM(nn.Module):
    """One LSTM whose hidden-to-hidden kernel is DropConnect-ed at `weight_p` when training (the
    dropped kernel is sown as `intermediates/dropped_hidden_kernel`). x [B, T, in], lengths [B] ->
    (outputs [B, T, hidden], final (c, h)), from `initial` (c, h) or zeros. torch.nn.LSTM's params
    and init: both biases (b_ih, b_hh), every array U(+-1/sqrt(hidden))."""
    input_dim: int
    hidden_dim: int
    weight_p: float = 0.0

    @nn.compact
    def __call__(self, x, lengths, enable_dropout: bool = False, initial=None):
        h = self.hidden_dim
        init = _uniform(1.0 / h ** 0.5)
        params = {"input_kernel": param_with_axes(self, "input_kernel", init, (self.input_dim, 4 * h),
                                                  ("lstm_in", "lstm_gates")),
                  "input_bias": param_with_axes(self, "input_bias", init, (4 * h,), ("lstm_gates",)),
                  "hidden_bias": param_with_axes(self, "hidden_bias", init, (4 * h,), ("lstm_gates",))}
        hidden_kernel = param_with_axes(self, "hidden_kernel", init, (h, 4 * h), ("lstm_hidden", "lstm_gates"))
        if enable_dropout and self.weight_p > 0.0:
            keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - self.weight_p, hidden_kernel.shape)
            hidden_kernel = jnp.where(keep, hidden_kernel / (1.0 - self.weight_p), 0.0)
            self.sow("intermediates", "dropped_hidden_kernel", hidden_kernel)
        if initial is None:
            initial = (jnp.zeros((x.shape[0], h), x.dtype),) * 2
        return masked_scan(lambda carry, x_t: torch_lstm_step(params, hidden_kernel, carry, x_t), initial, x, lengths)


def bidirectional(forward: nn.Module, backward: nn.Module, x, lengths):
    """Two LSTMs (`x, lengths -> ([B, T, h], final state)`) over [B, T, in], the second over each row's
    first `lengths` steps reversed: [B, T, 2h], both halves aligned with the input's steps."""
    back = backward(reverse_within_lengths(x, lengths), lengths)[0]
    return jnp.concatenate([forward(x, lengths)[0], reverse_within_lengths(back, lengths)], -1)


class BiLSTM(nn.Module):
    """A forward and a backward `WeightDropLSTM` of `hidden_dim` units: [B, T, in] -> [B, T, 2 x hidden_dim]."""
    hidden_dim: int

    @nn.compact
    def __call__(self, x, lengths):
        return bidirectional(WeightDropLSTM(x.shape[-1], self.hidden_dim, name="forward_lstm"),
                             WeightDropLSTM(x.shape[-1], self.hidden_dim, name="backward_lstm"), x, lengths)


class AWDLSTM(nn.Module):
    """Token ids [B, T] (pad 0 at the end) -> (every LSTM layer's output, a list of [B, T, width];
    every layer's final (c, h)), each layer from `initial_state` (a list of (c, h)) or zeros."""
    config: AWDLSTMConfig

    @nn.compact
    def __call__(self, tokens, enable_dropout: bool = False, initial_state=None):
        cfg = self.config
        table = param_with_axes(self, "embedding", _uniform(0.1), (cfg.vocab_size, cfg.emb_dim), ("vocab", "embed"))
        if enable_dropout and cfg.embed_p > 0.0:   # drops whole words: rows of the table
            keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - cfg.embed_p, (cfg.vocab_size, 1))
            table = jnp.where(keep, table / (1.0 - cfg.embed_p), 0.0)
        lengths = lengths_of(tokens)
        x = locked_dropout(self, table[tokens], cfg.input_p, enable_dropout)
        outputs, states = [], []
        for k, (input_dim, hidden_dim) in enumerate(cfg.layer_dims()):
            initial = None if initial_state is None else initial_state[k]
            x, state = WeightDropLSTM(input_dim, hidden_dim, cfg.weight_p, name=f"lstm_{k}")(
                x, lengths, enable_dropout, initial)
            outputs.append(x)
            states.append(state)
            if k < cfg.n_layers - 1:
                x = locked_dropout(self, x, cfg.hidden_p, enable_dropout)
        return outputs, states


class AWDLSTMLanguageModel(nn.Module):
    """Token ids [B, T] -> logits [B, T, vocab] of the next token (decoder tied to the embedding).
    The top layer's output is sown as `intermediates/raw_top` and, after its dropout, `dropped_top`
    (what AWD-LSTM's activation regularisers read).

    With `stream_rows` = B > 0 the LM is stateful as fastai's AWD_LSTM (`self.hidden`, detached
    after each batch): params `carried_state` hold each layer's (c, h) [B, width] after the last
    batch, no gradient reaches them, and a call with `reset_state` [B, 1] starts from them
    (from zeros where `reset_state` is 1, a stream's first batch) and sows its final state in the
    `running_statistics` collection, which the trainer writes over them after the step
    (`t5lite.models.running_statistics`). `initial_state` (a list of (c, h)) overrides both: the
    evaluator carries the state itself; the final state is sown there too."""
    config: AWDLSTMConfig
    stream_rows: int = 0

    @nn.compact
    def __call__(self, encoder_input_tokens, reset_state=None, enable_dropout: bool = False, initial_state=None):
        tokens = encoder_input_tokens
        cfg = self.config
        carried = [tuple(param_with_axes(self, f"carried_state_{k}_{part}", nn.initializers.zeros,
                                         (self.stream_rows, width), (None, "lstm_hidden")) for part in "ch")
                   for k, (_, width) in enumerate(cfg.layer_dims())] if self.stream_rows else None
        if initial_state is None and reset_state is not None and carried is not None:
            if tokens.shape[0] != self.stream_rows:
                raise ConfigError(f"the stateful LM carries {self.stream_rows} rows of state but this batch has "
                                  f"{tokens.shape[0]}: train with num_microbatches = 1 and the batch size the "
                                  "objective's stream_rows names")
            keep = reset_state.reshape(-1, 1) == 0
            initial_state = [tuple(jnp.where(keep, jax.lax.stop_gradient(x), 0.0) for x in layer) for layer in carried]
        encoder = AWDLSTM(cfg, name="encoder")
        outputs, final = encoder(tokens, enable_dropout, initial_state)
        if initial_state is not None and carried is not None:
            for k, layer in enumerate(final):
                for part, x in zip("ch", layer):
                    self.sow(RUNNING_STATISTICS, f"carried_state_{k}_{part}", jax.lax.stop_gradient(x))
        raw = outputs[-1]
        top = locked_dropout(self, raw, cfg.output_p, enable_dropout)
        self.sow("intermediates", "raw_top", raw)
        self.sow("intermediates", "dropped_top", top)
        bias = param_with_axes(self, "decoder_bias", nn.initializers.zeros, (cfg.vocab_size,), ("vocab",))
        if cfg.tie_weights:
            kernel = nn.unbox(encoder.variables["params"]["embedding"]).T
        else:
            kernel = param_with_axes(self, "decoder_kernel", _uniform(0.1), (cfg.emb_dim, cfg.vocab_size),
                                     ("embed", "vocab"))
        return top @ kernel + bias


def concat_pool(outputs, lengths):
    """fastai's masked concat pooling of [B, T, D] over each row's real steps: [last, max, mean]."""
    valid = (jnp.arange(outputs.shape[1])[None, :] < lengths[:, None])[..., None]
    last = jnp.take_along_axis(outputs, jnp.maximum(lengths - 1, 0)[:, None, None], axis=1)[:, 0]
    largest = jnp.max(jnp.where(valid, outputs, -jnp.inf), axis=1)
    mean = jnp.sum(jnp.where(valid, outputs, 0.0), axis=1) / jnp.maximum(lengths, 1)[:, None]
    return jnp.concatenate([last, largest, mean], axis=-1)


class BatchNorm1d(nn.Module):
    """torch.nn.BatchNorm1d over the last axis of [B, D]: in training the batch's mean and biased
    variance normalise and the running mean and unbiased variance move by `momentum` towards them;
    evaluation normalises with the running ones. Those are params no gradient reaches: the training
    forward pass sows their new values in the `running_statistics` collection and the trainer
    stores them after the step (`t5lite.models.running_statistics`). `bias_init`: torch's 0; the
    head's are fastai's `BatchNorm`, 1e-3."""
    momentum: float = 0.1
    epsilon: float = 1e-5
    axis_name: str = "embed"
    bias_init: float = 0.0

    @nn.compact
    def __call__(self, x, training: bool = False):
        axes = (self.axis_name,)
        scale = param_with_axes(self, "scale", nn.initializers.ones, (x.shape[-1],), axes)
        bias = param_with_axes(self, "bias", nn.initializers.constant(self.bias_init), (x.shape[-1],), axes)
        running_mean = param_with_axes(self, "running_mean", nn.initializers.zeros, (x.shape[-1],), axes)
        running_var = param_with_axes(self, "running_var", nn.initializers.ones, (x.shape[-1],), axes)
        if training:
            mean, var = jnp.mean(x, 0), jnp.var(x, 0)
            unbiased = jax.lax.stop_gradient(var) * x.shape[0] / max(x.shape[0] - 1, 1)
            m = self.momentum
            self.sow(RUNNING_STATISTICS, "running_mean", (1 - m) * running_mean + m * jax.lax.stop_gradient(mean))
            self.sow(RUNNING_STATISTICS, "running_var", (1 - m) * running_var + m * unbiased)
        else:
            mean, var = running_mean, running_var
        return (x - mean) * jax.lax.rsqrt(var + self.epsilon) * scale + bias


class PoolingLinearClassifier(nn.Module):
    """fastai's classifier head (`PoolingLinearClassifier` of `LinBnDrop` blocks): concat-pooled
    features -> BatchNorm, dropout `ps[0]`, `hidden` ReLUs -> BatchNorm, dropout `ps[1]`, class
    logits; the linear layers have no bias (the BatchNorm before each has one). Init as fastai's:
    BatchNorm bias 1e-3 (fastai.layers.BatchNorm), linear kernels torch.nn.Linear's. The BatchNorm is what
    lets the head learn from an LM's pooled features: they vary across sentences by a small fraction
    of their size, so without it every unit's pre-activation is nearly constant, dropout noise
    swamps the rest, and the ReLUs die."""
    num_classes: int
    hidden: int = 50
    ps: tuple[float, float] = (0.4, 0.1)

    @nn.compact
    def __call__(self, pooled, enable_dropout: bool = False):
        x = pooled
        dims = ((self.hidden, ("embed", "mlp")), (self.num_classes, ("mlp", "classes")))
        for k, ((width, axes), rate) in enumerate(zip(dims, self.ps)):
            x = BatchNorm1d(axis_name=axes[0], bias_init=1e-3, name=f"bn_{k}")(x, enable_dropout)
            x = nn.Dropout(rate, deterministic=not enable_dropout)(x)
            x = nn.Dense(width, use_bias=False, name=f"linear_{k}",
                         kernel_init=nn.with_logical_partitioning(torch_linear_init, axes))(x)
            if k == 0:
                x = nn.relu(x)
        return x


class AWDLSTMClassifier(nn.Module):
    """ULMFiT's classifier: token ids [B, T] -> logits [B, classes]. As fastai's, the encoder's top
    layer is pooled without dropout; the head's dropouts are `output_p` and 0.1."""
    config: AWDLSTMConfig
    num_classes: int = 2
    hidden: int = 50

    @nn.compact
    def __call__(self, encoder_input_tokens, enable_dropout: bool = False):
        tokens = encoder_input_tokens
        cfg = self.config
        top = AWDLSTM(cfg, name="encoder")(tokens, enable_dropout)[0][-1]
        pooled = concat_pool(top, lengths_of(tokens))
        return PoolingLinearClassifier(self.num_classes, self.hidden, (cfg.output_p, 0.1), name="head")(
            pooled, enable_dropout)
