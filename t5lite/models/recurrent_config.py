"""Configs and presets of the recurrent families: ELMo's biLM and ULMFiT's AWD-LSTM.

They are their own dataclasses (a char CNN and an LSTM stack share few fields with a Transformer)
but behave like `ModelConfig` where the trainer needs it: a named preset from
`t5lite.models.get_config`, `replace`, and a `vocab_size` (the word softmax); t5lite.models.flops counts their FLOPs.
"""
from __future__ import annotations

import dataclasses

from t5lite.errors import ConfigError
from t5lite.models.replaceable import Replaceable

_ELMO_FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))


@dataclasses.dataclass(frozen=True)
class BiLMConfig(Replaceable):
    """The fields of the original options.json (`char_cnn` and `lstm`), plus the word softmax of
    pre-training (`vocab_size`; 0 in the released files, which hold no softmax) and its dropout."""
    filters: tuple[tuple[int, int], ...] = _ELMO_FILTERS
    char_embed_dim: int = 16
    n_characters: int = 262
    n_highway: int = 2
    activation: str = "relu"
    lstm_dim: int = 4096
    projection_dim: int = 512
    n_layers: int = 2
    cell_clip: float | None = 3.0
    proj_clip: float | None = 3.0
    use_skip_connections: bool = True
    vocab_size: int = 0
    dropout_rate: float = 0.1
    dtype: str = "float32"
    arch: str = dataclasses.field(default="bilm", init=False)

    @classmethod
    def from_options(cls, options: dict, **more) -> "BiLMConfig":
        cnn, lstm = options["char_cnn"], options["lstm"]
        if cnn.get("max_characters_per_token", 50) != 50:
            raise ConfigError(f"options.json: max_characters_per_token "
                              f"{cnn['max_characters_per_token']}; ELMo's character ids use 50")
        return cls(filters=tuple(tuple(f) for f in cnn["filters"]),
                   char_embed_dim=cnn["embedding"]["dim"], n_characters=cnn["n_characters"],
                   n_highway=cnn["n_highway"], activation=cnn["activation"], lstm_dim=lstm["dim"],
                   projection_dim=lstm["projection_dim"], n_layers=lstm["n_layers"],
                   cell_clip=lstm.get("cell_clip"), proj_clip=lstm.get("proj_clip"),
                   use_skip_connections=lstm.get("use_skip_connections", False), **more)

    def to_options(self) -> dict:
        return {"char_cnn": {"filters": [list(f) for f in self.filters],
                             "embedding": {"dim": self.char_embed_dim},
                             "n_characters": self.n_characters, "n_highway": self.n_highway,
                             "activation": self.activation, "max_characters_per_token": 50},
                "lstm": {"dim": self.lstm_dim, "projection_dim": self.projection_dim,
                         "n_layers": self.n_layers, "cell_clip": self.cell_clip,
                         "proj_clip": self.proj_clip,
                         "use_skip_connections": self.use_skip_connections}}


@dataclasses.dataclass(frozen=True)
class AWDLSTMConfig(Replaceable):
    """fastai's AWD-LSTM (Merity et al., 2017, as ULMFiT uses it): an embedding, `n_layers` LSTMs
    (the last one `emb_dim` wide so the decoder can tie to the embedding) and five dropouts:
    `embed_p` (whole embedding rows), `input_p` (variational, on the embeddings), `weight_p`
    (DropConnect on the hidden-to-hidden weights), `hidden_p` (variational, between layers) and
    `output_p` (variational, before the decoder; the classifier head's first dropout, as fastai)."""
    vocab_size: int = 60_000
    emb_dim: int = 400
    hidden_dim: int = 1152
    n_layers: int = 3
    embed_p: float = 0.02
    input_p: float = 0.25
    weight_p: float = 0.2
    hidden_p: float = 0.15
    output_p: float = 0.1
    tie_weights: bool = True
    dtype: str = "float32"
    arch: str = dataclasses.field(default="awd_lstm", init=False)

    def layer_dims(self) -> list[tuple[int, int]]:
        """(input, hidden) width of each LSTM layer."""
        dims = [self.emb_dim] + [self.hidden_dim] * (self.n_layers - 1) + [self.emb_dim]
        return list(zip(dims[:-1], dims[1:]))


# fastai's `awd_lstm_lm_config` and `awd_lstm_clas_config` dropouts.
AWD_LSTM_LM_DROPOUTS = dict(embed_p=0.02, input_p=0.25, weight_p=0.2, hidden_p=0.15, output_p=0.1)
AWD_LSTM_CLAS_DROPOUTS = dict(embed_p=0.05, input_p=0.4, weight_p=0.5, hidden_p=0.3, output_p=0.4)

_ONE_BILLION_WORDS_VOCAB = 793_471   # the released ELMo models' softmax (1B Word Benchmark)

RECURRENT_PRESETS = {
    # ELMo's released sizes: 2 x lstm_dim with projection, 2048 char-CNN filters, highway layers.
    "elmo_original": lambda: BiLMConfig(vocab_size=_ONE_BILLION_WORDS_VOCAB),     # 2x4096_512_2048cnn_2xhighway
    "elmo_medium": lambda: BiLMConfig(lstm_dim=2048, projection_dim=256, n_highway=1,
                                      vocab_size=_ONE_BILLION_WORDS_VOCAB),        # 2x2048_256_2048cnn_1xhighway
    "elmo_small": lambda: BiLMConfig(lstm_dim=1024, projection_dim=128, n_highway=1,
                                     vocab_size=_ONE_BILLION_WORDS_VOCAB),         # 2x1024_128_2048cnn_1xhighway
    "elmo_tiny": lambda: BiLMConfig(filters=((1, 16), (2, 16), (3, 32), (4, 64)), char_embed_dim=8, n_highway=1,
                                    lstm_dim=256, projection_dim=64, vocab_size=8192),
    "awd_lstm": lambda: AWDLSTMConfig(),
    "awd_lstm_tiny": lambda: AWDLSTMConfig(vocab_size=8192, emb_dim=64, hidden_dim=256),
    # The same sizes with fastai's classifier dropouts (the LM's weights load unchanged).
    "awd_lstm_classifier": lambda: AWDLSTMConfig(**AWD_LSTM_CLAS_DROPOUTS),
    "awd_lstm_tiny_classifier": lambda: AWDLSTMConfig(vocab_size=8192, emb_dim=64, hidden_dim=256,
                                                      **AWD_LSTM_CLAS_DROPOUTS),
}
