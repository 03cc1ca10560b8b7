"""The BERT family: BERT, RoBERTa, ALBERT and ELECTRA share one post-norm encoder layout and differ
in where they keep their tensors (`EncoderNames`) and in a few options: RoBERTa offsets positions
past the pad id, ALBERT shares one layer and factorises the embeddings, ELECTRA projects embeddings
when they are narrower than the hidden size and has a discriminator head."""
from __future__ import annotations

import dataclasses

import numpy as np

from t5lite.interop.hf.fields import ACT_TO_HF, HFConversionError, activation_from_hf, require
from t5lite.interop.hf.rules import Rule, attention, dense, mlp, norm
from t5lite.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class EncoderNames:
    """Where one BERT-family member keeps its tensors."""
    model_type: str
    prefix: str
    mlm: tuple[str, str, str]          # transform dense, transform LayerNorm, output bias
    projection: str | None = None      # factorised embedding -> hidden
    pooler: str = "pooler.dense"
    mlm_architecture: str = ""
    discriminator: tuple[str, str] | None = None
    sentence: str | None = None        # NSP / SOP classifier on the pooler
    attention: tuple[str, ...] = ("self.query", "self.key", "self.value", "output.dense")


MEMBERS = {
    "bert": EncoderNames("bert", "bert", ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                                          "cls.predictions.bias"), mlm_architecture="BertForMaskedLM",
                         sentence="cls.seq_relationship"),
    "roberta": EncoderNames("roberta", "roberta", ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
                            mlm_architecture="RobertaForMaskedLM"),
    "albert": EncoderNames("albert", "albert", ("predictions.dense", "predictions.LayerNorm", "predictions.bias"),
                           projection="encoder.embedding_hidden_mapping_in", pooler="pooler",
                           mlm_architecture="AlbertForMaskedLM", sentence="sop_classifier.classifier"),
    "electra": EncoderNames("electra", "electra", ("generator_predictions.dense", "generator_predictions.LayerNorm",
                                                   "generator_lm_head.bias"),
                            projection="embeddings_project", mlm_architecture="ElectraForMaskedLM",
                            discriminator=("discriminator_predictions.dense",
                                           "discriminator_predictions.dense_prediction")),
}


class EncoderFamily:
    """One member of the family, by its names. A subclass (DeBERTa) changes the position encoding
    through `check`, `positions`, `position_rules` and `extra_hf_fields`."""
    position_encoding = "learned"

    def __init__(self, names: EncoderNames):
        self.names = names

    @property
    def model_name(self) -> str:
        """The prefix of the HF class names (BertModel, AlbertForMaskedLM, ...)."""
        return self.names.model_type.capitalize()

    def check(self, c: dict, tensors: dict[str, np.ndarray]) -> None:
        """Refuses an HF config t5lite cannot load."""
        if c.get("position_embedding_type", "absolute") != "absolute":
            raise HFConversionError(f"position_embedding_type={c['position_embedding_type']!r} is not supported")
        if self.names.model_type == "albert" and (c.get("num_hidden_groups", 1) != 1 or
                                                  c.get("inner_group_num", 1) != 1):
            raise HFConversionError("ALBERT with num_hidden_groups or inner_group_num other than 1 is not supported")

    def positions(self, c: dict) -> dict:
        return dict(position_encoding="learned")

    def from_hf(self, c: dict, tensors: dict[str, np.ndarray]) -> ModelConfig:
        self.check(c, tensors)
        n = self.names
        names = set(tensors) | {k.split(".", 1)[1] for k in tensors if "." in k}   # with and without prefix
        head = "mlm" if n.mlm[2] in names else "discriminator" if n.discriminator and \
            f"{n.discriminator[0]}.weight" in names else "none"
        offset = c.get("pad_token_id", 1) + 1 if n.model_type == "roberta" else 0
        hidden = c["hidden_size"]
        embedding = c.get("embedding_size", hidden)
        factorised = n.model_type == "albert" or (n.model_type == "electra" and embedding != hidden)
        return ModelConfig(
            arch="encoder", vocab_size=c["vocab_size"], d_model=hidden, num_heads=c["num_attention_heads"],
            head_dim=hidden // c["num_attention_heads"], d_ff=c["intermediate_size"],
            num_encoder_layers=c["num_hidden_layers"], num_decoder_layers=0,
            mlp_activations=(activation_from_hf(c.get("hidden_act", "gelu")),),
            dropout_rate=c.get("hidden_dropout_prob", 0.1), mlp_dropout=False,
            norm="layer", norm_position="post", final_norm=False, embedding_norm=True, use_bias=True,
            scale_attention=True, layer_norm_epsilon=c.get("layer_norm_eps", 1e-12), init_std=0.02,
            pad_token_id=c.get("pad_token_id", 0) or 0, embedding_size=embedding if factorised else None,
            type_vocab_size=c.get("type_vocab_size", 2), **self.positions(c),
            max_position_embeddings=c.get("max_position_embeddings", 512) - offset, position_offset=offset,
            share_layers=n.model_type == "albert", scale_tied_logits=False, encoder_head=head,
            pooler=f"{n.pooler}.weight" in names, sentence_head=bool(n.sentence) and f"{n.sentence}.weight" in names)

    def extra_hf_fields(self, cfg: ModelConfig) -> dict:
        """The config.json fields only some members have."""
        if self.names.model_type == "albert":
            return dict(embedding_size=cfg.embed_dim, num_hidden_groups=1, inner_group_num=1,
                        classifier_dropout_prob=cfg.dropout_rate)
        if self.names.model_type == "electra":
            return dict(embedding_size=cfg.embed_dim)
        return {}

    def to_hf(self, cfg: ModelConfig) -> dict:
        n = self.names
        require(cfg, n.model_type, arch="encoder", norm="layer", norm_position="post", final_norm=False,
                embedding_norm=True, use_bias=True, scale_attention=True, position_encoding=self.position_encoding,
                scale_embeddings=False, tie_embeddings=True, share_layers=n.model_type == "albert", pooler_activation="tanh",
                position_offset=cfg.pad_token_id + 1 if n.model_type == "roberta" else 0)
        if len(cfg.mlp_activations) != 1:
            raise HFConversionError(f"{n.model_type} cannot express a gated MLP {cfg.mlp_activations}")
        if cfg.num_heads * cfg.head_dim != cfg.d_model:
            raise HFConversionError(f"{n.model_type} needs num_heads * head_dim == d_model")
        if n.projection is None:
            require(cfg, n.model_type, embedding_size=None)
        if n.model_type == "electra" and cfg.embedding_size == cfg.d_model:
            raise HFConversionError("ELECTRA projects embeddings only when embedding_size != d_model; use None")
        arch = {"mlm": n.mlm_architecture, "none": f"{self.model_name}Model",
                "discriminator": "ElectraForPreTraining"}[cfg.encoder_head]
        if cfg.sentence_head:
            if cfg.encoder_head != "mlm" or not n.sentence:
                raise HFConversionError(f"{n.model_type} has no architecture with this head and a sentence head")
            arch = arch.replace("ForMaskedLM", "ForPreTraining")
        return dict(model_type=n.model_type, architectures=[arch],
                    vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.num_encoder_layers,
                    num_attention_heads=cfg.num_heads, intermediate_size=cfg.d_ff,
                    hidden_act=ACT_TO_HF[cfg.mlp_activations[0]], hidden_dropout_prob=cfg.dropout_rate,
                    attention_probs_dropout_prob=cfg.dropout_rate, layer_norm_eps=cfg.layer_norm_epsilon,
                    max_position_embeddings=cfg.max_position_embeddings + cfg.position_offset,
                    type_vocab_size=cfg.type_vocab_size, pad_token_id=cfg.pad_token_id, initializer_range=0.02,
                    tie_word_embeddings=True) | self.extra_hf_fields(cfg)

    def position_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [Rule(f"{self.names.prefix}.embeddings.position_embeddings.weight",
                     ("encoder/position_embedder/table/embedding",))]

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        n, p = self.names, self.names.prefix
        rules = [Rule(f"{p}.embeddings.word_embeddings.weight", ("token_embedder/embedding",))]
        rules += self.position_rules(cfg)
        if cfg.type_vocab_size:
            rules.append(Rule(f"{p}.embeddings.token_type_embeddings.weight",
                              ("encoder/token_type_embedder/embedding",)))
        rules += norm(f"{p}.embeddings.LayerNorm", "encoder/embedding_norm")
        if cfg.embedding_size is not None:
            rules += dense(f"{p}.{n.projection}", "encoder/embedding_projection")
        if n.model_type == "albert":
            layers = [(f"{p}.encoder.albert_layer_groups.0.albert_layers.0", "encoder/layers")]
        else:
            layers = [(f"{p}.encoder.layer.{i}", f"encoder/layers_{i}") for i in range(cfg.num_encoder_layers)]
        for hf, ours in layers:
            if n.model_type == "albert":
                rules += attention(f"{hf}.attention", f"{ours}/self_attention", ("query", "key", "value", "dense"))
                rules += norm(f"{hf}.attention.LayerNorm", f"{ours}/self_attention_norm")
                rules += mlp(f"{hf}.ffn", f"{hf}.ffn_output", f"{ours}/mlp", cfg)
                rules += norm(f"{hf}.full_layer_layer_norm", f"{ours}/mlp_norm")
            else:
                rules += attention(f"{hf}.attention", f"{ours}/self_attention", n.attention)
                rules += norm(f"{hf}.attention.output.LayerNorm", f"{ours}/self_attention_norm")
                rules += mlp(f"{hf}.intermediate.dense", f"{hf}.output.dense", f"{ours}/mlp", cfg)
                rules += norm(f"{hf}.output.LayerNorm", f"{ours}/mlp_norm")
        if cfg.pooler:
            rules += dense(f"{p}.{n.pooler}", "pooler/dense")
        if cfg.sentence_head:
            rules += dense(n.sentence, "sentence_head/classifier")
        if cfg.encoder_head == "mlm":
            rules += dense(n.mlm[0], "mlm_head/dense") + norm(n.mlm[1], "mlm_head/norm")
            rules.append(Rule(n.mlm[2], ("mlm_head/bias",)))
        elif cfg.encoder_head == "discriminator":
            if n.discriminator is None:
                raise HFConversionError(f"{n.model_type} has no discriminator head")
            rules += dense(n.discriminator[0], "discriminator_head/dense")
            rules += dense(n.discriminator[1], "discriminator_head/prediction")
        return rules
