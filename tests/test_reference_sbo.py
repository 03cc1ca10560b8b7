"""SpanBERT's span boundary objective against SpanBERT's own code (not on PyPI), transcribed below in
torch from facebookresearch/SpanBERT:

- pretraining/fairseq/models/pair_bert.py: `gelu`, `BertLayerNorm`, `MLPWithLayerNorm`,
  `BertPairTargetPredictionHead` (`max_targets` = the published `--max-pair-targets 15`; its
  position vectors d_model wide instead of 200, the one difference t5lite keeps: the head's
  docstring says why);
- pretraining/fairseq/data/no_nsp_span_bert_dataset.py: `NoNSPSpanBertDataset.__getitem__`'s shift
  of the pair boundaries past [CLS] and `_collate`'s split of pair targets into `pairs` and targets;
- pretraining/fairseq/criterions/spanbert_loss.py: the SBO part of `NoNSPPairLoss.forward`
  (`pair_loss` summed, `npairs` = the non-pad pair targets + 1).

The pair targets come from SpanBERT's masking scheme, transcribed in tests/test_reference_corruption.py,
on the same draws as t5lite's `spanbert_mlm`; the blocks' words are about three pieces long, so
spans of up to 10 words have more than 10 tokens. The head's weights are t5lite's, the encoder
states t5lite's: what is compared is the head and the loss over SpanBERT's pair targets."""
import math

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from objectives_helpers import PieceVocabulary, features
from test_reference_corruption import NumpyRandom, ParagraphInfo, SpanBertDictionary, spanbert_pair_with_span_mask

from t5lite import models
from t5lite.data.corruption import masking
from t5lite.objectives.base import LossConfig
from t5lite.objectives.encoder import MlmSboObjective

torch = pytest.importorskip("torch", reason="the SpanBERT reference is PyTorch (extras 'hf')")
nn = torch.nn

MAX_PAIR_TARGETS = 15     # pretraining/README.md: --max-pair-targets 15
PAD = 0


# ----------------------------------------------------------------------------- pair_bert.py

def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


class BertLayerNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-12):
        super(BertLayerNorm, self).__init__()
        self.gamma = nn.Parameter(torch.ones(hidden_size))
        self.beta = nn.Parameter(torch.zeros(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x):
        u = x.mean(-1, keepdim=True)
        s = (x - u).pow(2).mean(-1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.variance_epsilon)
        return self.gamma * x + self.beta


class MLPWithLayerNorm(nn.Module):
    def __init__(self, hidden_size, input_size):
        super(MLPWithLayerNorm, self).__init__()
        self.linear1 = nn.Linear(input_size, hidden_size)
        self.non_lin1 = gelu
        self.layer_norm1 = BertLayerNorm(hidden_size, eps=1e-12)
        self.linear2 = nn.Linear(hidden_size, hidden_size)
        self.non_lin2 = gelu
        self.layer_norm2 = BertLayerNorm(hidden_size, eps=1e-12)

    def forward(self, hidden):
        return self.layer_norm2(self.non_lin2(self.linear2(self.layer_norm1(self.non_lin1(self.linear1(hidden))))))


class BertPairTargetPredictionHead(nn.Module):
    def __init__(self, hidden_size, bert_model_embedding_weights, max_targets=20, position_embedding_size=200):
        super(BertPairTargetPredictionHead, self).__init__()
        self.position_embeddings = nn.Embedding(max_targets, position_embedding_size)
        self.mlp_layer_norm = MLPWithLayerNorm(hidden_size, hidden_size * 2 + position_embedding_size)
        self.decoder = nn.Linear(bert_model_embedding_weights.size(1), bert_model_embedding_weights.size(0),
                                 bias=False)
        self.decoder.weight = bert_model_embedding_weights
        self.bias = nn.Parameter(torch.zeros(bert_model_embedding_weights.size(0)))
        self.max_targets = max_targets

    def forward(self, hidden_states, pairs):
        bs, num_pairs, _ = pairs.size()
        bs, seq_len, dim = hidden_states.size()
        left, right = pairs[:, :, 0], pairs[:, :, 1]
        left_hidden = torch.gather(hidden_states, 1, left.unsqueeze(2).repeat(1, 1, dim))
        left_hidden = left_hidden.contiguous().view(bs * num_pairs, dim).unsqueeze(1).repeat(1, self.max_targets, 1)
        right_hidden = torch.gather(hidden_states, 1, right.unsqueeze(2).repeat(1, 1, dim))
        right_hidden = right_hidden.contiguous().view(bs * num_pairs, dim).unsqueeze(1).repeat(1, self.max_targets, 1)
        position_embeddings = self.position_embeddings.weight
        hidden_states = self.mlp_layer_norm(torch.cat(
            (left_hidden, right_hidden, position_embeddings.unsqueeze(0).repeat(bs * num_pairs, 1, 1)), -1))
        target_scores = self.decoder(hidden_states) + self.bias
        return target_scores


# ----------------------------------------------------------------------------- no_nsp_span_bert_dataset.py

def shifted_past_cls(pair_targets):
    """`__getitem__`: "add 1 to the first two since they are input indices. Rest are targets." """
    return [[(x + 1) if i < 2 else x for i, x in enumerate(pair_tgt)] for pair_tgt in pair_targets]


# ----------------------------------------------------------------------------- spanbert_loss.py

def sbo_loss(pair_target_logits, pair_targets, padding_idx=PAD):
    """`NoNSPPairLoss.forward`'s SBO part: (pair_loss, npairs)."""
    pair_target_logits = pair_target_logits.view(-1, pair_target_logits.size(-1))
    pair_targets = pair_targets.view(-1)
    pair_loss = torch.nn.functional.cross_entropy(pair_target_logits, pair_targets, reduction="sum",
                                                  ignore_index=padding_idx)
    npairs = pair_targets[pair_targets != padding_idx].numel() + 1
    return pair_loss, npairs


# ----------------------------------------------------------------------------- the comparison

def spanbert_head_from(params, d_model):
    """SpanBERT's head holding t5lite's SBO weights (torch's Linear keeps the kernel transposed)."""
    p = jax.tree.map(lambda a: torch.tensor(np.asarray(a, np.float64)), flax.core.meta.unbox(params))
    sbo = p["span_boundary_head"]
    head = BertPairTargetPredictionHead(d_model, nn.Parameter(p["token_embedder"]["embedding"]), MAX_PAIR_TARGETS,
                                        position_embedding_size=d_model).double()
    with torch.no_grad():
        head.position_embeddings.weight.copy_(sbo["position"]["embedding"])
        mlp = head.mlp_layer_norm
        for k, (linear, norm) in enumerate([(mlp.linear1, mlp.layer_norm1), (mlp.linear2, mlp.layer_norm2)]):
            linear.weight.copy_(sbo[f"dense_{k}"]["kernel"].T)
            linear.bias.copy_(sbo[f"dense_{k}"]["bias"])
            norm.gamma.copy_(sbo[f"norm_{k}"]["scale"])
            norm.beta.copy_(sbo[f"norm_{k}"]["bias"])
        head.bias.copy_(sbo["bias"])
    return head


def test_sbo_loss_equals_spanberts_pair_target_head_and_loss():
    vocabulary = PieceVocabulary(wordpiece=True)
    ids = masking.special_ids(vocabulary)
    mask_id, cls, sep = ids["mask"], ids["cls"], ids["sep"]
    pool = masking.random_pool(vocabulary)
    rows, pair_targets = [], []
    for seed in range(2):
        block = np.random.default_rng(500 + seed).integers(3, vocabulary.vocab_size - vocabulary.extra_ids, 90)
        (row,) = masking.spanbert_mlm([{"inputs": np.concatenate([[cls], block, [sep]])}], features(vocabulary), seed)
        rows.append(row)
        _, _, pairs = spanbert_pair_with_span_mask(block, ParagraphInfo(SpanBertDictionary(vocabulary)), pool, PAD,
                                                   mask_id, NumpyRandom([seed, 4, 0]))
        pair_targets.append(shifted_past_cls(pairs))
    # Spans longer than 10 tokens: their 11th to 15th tokens are SBO targets too.
    assert max(sum(t != PAD for t in pair[2:]) for pairs in pair_targets for pair in pairs) > 10

    batch = {"encoder_input_tokens": np.stack([r["inputs"] for r in rows]),
             "encoder_target_tokens": np.stack([r["targets"] for r in rows]),
             "encoder_loss_weights": np.stack([r["targets_loss_weights"] for r in rows]),
             "token_type_ids": np.zeros((2, len(rows[0]["inputs"])), np.int32),
             **{k: np.stack([r[k] for r in rows]) for k in
                ("span_left_boundary", "span_right_boundary", "span_relative_position")}}
    batch = {k: jnp.asarray(v, jnp.int32) for k, v in batch.items()}
    cfg = models.get_config("bert_tiny", vocab_size=vocabulary.vocab_size, dropout_rate=0.0,
                            max_position_embeddings=128, span_boundary_head=True)
    module = models.build(cfg)
    shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), encoder_input_tokens=batch["encoder_input_tokens"]))
    rng = np.random.default_rng(0)
    variables = jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, 0.2, s.shape), s.dtype), shapes)
    objective, loss = MlmSboObjective(), LossConfig(z_loss=0.0)
    _, metrics = objective.loss_and_metrics(module, variables["params"], batch, None,
                                            objective.normalizers(batch, loss), loss)

    hidden = torch.tensor(np.asarray(module.apply(variables, **batch, method="encode"), np.float64))
    head = spanbert_head_from(variables["params"], cfg.d_model)
    total, count = 0.0, 0
    for row, pairs in enumerate(pair_targets):           # one sample at a time: sums add over a batch
        pairs = torch.tensor(pairs, dtype=torch.long)[None]
        with torch.no_grad():
            scores = head(hidden[row:row + 1], pairs[:, :, :2])
        pair_loss, npairs = sbo_loss(scores, pairs[:, :, 2:])
        total, count = total + float(pair_loss), count + npairs - 1
    ours_total, ours_count = (float(x) for x in metrics["sbo_loss"])
    assert ours_count == count
    assert ours_total == pytest.approx(total, rel=1e-5)
