"""Input corruption against the upstream functions it names, transcribed here (neither package is
on PyPI):

- google-research/bert, create_pretraining_data.py: `truncate_seq_pair`, driven by the same
  sequence of random draws as t5lite's `_truncate_pair`;
- facebookresearch/SpanBERT, pretraining/fairseq/data/masking.py: `PairWithSpanMaskingScheme.__init__`'s
  span-length distribution (`self.len_distrib`, span_lower 1, span_upper 10, geometric_p 0.2)."""
import math

import numpy as np
import pytest
from objectives_helpers import PieceVocabulary, features

from t5lite.data.corruption import masking
from t5lite.data.corruption import sentence_pairs
from t5lite.data.corruption.sentence_pairs import _truncate_pair


class Draws:
    """The same uniform draws for both sides: `random()` as Python's random.Random and numpy's Generator offer it."""

    def __init__(self, seed):
        self._values = iter(np.random.default_rng(seed).random(10_000).tolist())

    def random(self):
        return next(self._values)


def bert_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_num_tokens:
            break
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc_tokens) >= 1
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def albert_create_instances_from_document(all_documents, document_index, max_seq_length, short_seq_prob,
                                          rng, random_next_sentence):
    """google-research/albert create_pretraining_data.py `create_instances_from_document`, its
    FLAGS.random_next_sentence a parameter; with it True the lines run are google-research/bert
    create_pretraining_data.py's `create_instances_from_document` (ALBERT adds the SOP `elif`). The
    `create_masked_lm_predictions` call and TrainingInstance are left out: (tokens, segment_ids,
    is_random_next) per instance."""
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    current_chunk = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])
                tokens_b = []
                is_random_next = False
                if len(current_chunk) == 1 or (random_next_sentence and rng.random() < 0.5):
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break
                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    num_unused_segments = len(current_chunk) - a_end
                    i -= num_unused_segments
                elif not random_next_sentence and rng.random() < 0.5:
                    is_random_next = True
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                    tokens_a, tokens_b = tokens_b, tokens_a
                else:
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                bert_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                assert len(tokens_a) >= 1
                assert len(tokens_b) >= 1
                tokens = ["[CLS]", *tokens_a, "[SEP]", *tokens_b, "[SEP]"]
                segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                instances.append((tokens, segment_ids, is_random_next))
            current_chunk = []
            current_length = 0
        i += 1
    return instances


class PythonRandom:
    """random.Random's `random` and `randint` (both ends included) over a numpy Generator's stream, so
    upstream code and t5lite (which calls the Generator's `random` and `integers`) share every draw."""

    def __init__(self, seed):
        self._rng = np.random.default_rng(seed)

    def random(self):
        return self._rng.random()

    def randint(self, a, b):
        return int(self._rng.integers(a, b + 1))


@pytest.mark.parametrize("objective", ["nsp", "sop"])
@pytest.mark.parametrize("seed", range(12))
def test_document_pairs_equal_berts_and_alberts_create_instances_from_document(objective, seed):
    rng = np.random.default_rng(2000 + seed)
    documents = [[rng.integers(5, 99, int(rng.integers(1, 25))) for _ in range(int(rng.integers(1, 9)))]
                 for _ in range(int(rng.integers(1, 6)))]
    max_seq_length, short_seq_prob = int(rng.integers(8, 64)), [0.1, 0.5][seed % 2]
    upstream = PythonRandom(seed)
    ours = np.random.default_rng(seed)
    for index in range(len(documents)):
        theirs = albert_create_instances_from_document([[s.tolist() for s in d] for d in documents], index,
                                                       max_seq_length, short_seq_prob, upstream,
                                                       random_next_sentence=objective == "nsp")
        theirs = [([{"[CLS]": 1001, "[SEP]": 1002}.get(t, t) for t in tokens], segment_ids, is_random_next)
                  for tokens, segment_ids, is_random_next in theirs]
        mine = [(sentence_pairs._pair_example(a, b, {"cls": 1001, "sep": 1002}), label) for a, b, label in
                sentence_pairs.document_pairs(documents, index, max_seq_length - 3, short_seq_prob, objective, ours)]
        assert [(ex["inputs"].tolist(), ex["token_type_ids"].tolist(), bool(label)) for ex, label in mine] == theirs


@pytest.mark.parametrize("seed", range(50))
def test_truncate_pair_equals_berts_truncate_seq_pair(seed):
    rng = np.random.default_rng(1000 + seed)
    a, b = rng.integers(5, 99, int(rng.integers(1, 40))), rng.integers(5, 99, int(rng.integers(1, 40)))
    if seed % 3 == 0:
        b = rng.integers(5, 99, len(a))              # equal lengths: BERT cuts B first
    max_tokens = int(rng.integers(2, len(a) + len(b) + 2))
    theirs_a, theirs_b = a.tolist(), b.tolist()
    bert_truncate_seq_pair(theirs_a, theirs_b, max_tokens, Draws(seed))
    ours_a, ours_b = _truncate_pair(a, b, max_tokens, Draws(seed))
    assert (ours_a.tolist(), ours_b.tolist()) == (theirs_a, theirs_b)


def test_span_length_distribution_equals_spanberts():
    lower, upper, p = 1, 10, 0.2
    len_distrib = [p * (1 - p) ** (i - lower) for i in range(lower, upper + 1)] if p >= 0 else None
    len_distrib = [x / (sum(len_distrib)) for x in len_distrib]
    np.testing.assert_allclose(masking.span_length_distribution(p, upper), len_distrib, rtol=1e-12)


# --- google-research/electra, pretrain/pretrain_helpers.py: `scatter_update`, `get_candidates_mask` and
# `mask`, in TF2 (tf.log -> tf.math.log, modeling.get_shape_list -> static shapes, the config's vocab
# and max_predictions_per_seq passed in). The two random ops are parameters so a test can feed them
# t5lite's draws; left at their defaults they are ELECTRA's own tf.random calls.

def electra_scatter_update(tf, sequence, updates, positions):
    B, L = sequence.shape
    D = 1
    sequence = tf.expand_dims(sequence, -1)
    N = positions.shape[1]
    shift = tf.expand_dims(L * tf.range(B), -1)
    flat_positions = tf.reshape(positions + shift, [-1, 1])
    flat_updates = tf.reshape(updates, [-1, D])
    updates = tf.scatter_nd(flat_positions, flat_updates, [B * L, D])
    updates = tf.reshape(updates, [B, L, D])
    flat_updates_mask = tf.ones([B * N], tf.int32)
    updates_mask = tf.scatter_nd(flat_positions, flat_updates_mask, [B * L])
    updates_mask = tf.reshape(updates_mask, [B, L])
    not_first_token = tf.concat([tf.zeros((B, 1), tf.int32), tf.ones((B, L - 1), tf.int32)], -1)
    updates_mask *= not_first_token
    updates_mask_3d = tf.expand_dims(updates_mask, -1)
    updates = tf.math.floordiv(updates, tf.maximum(1, updates_mask_3d))
    updates_mask = tf.minimum(updates_mask, 1)
    updates_mask_3d = tf.minimum(updates_mask_3d, 1)
    updated_sequence = (((1 - updates_mask_3d) * sequence) + (updates_mask_3d * updates))
    return tf.squeeze(updated_sequence, -1), updates_mask


def electra_get_candidates_mask(tf, vocab, input_ids, input_mask):
    ignore_ids = [vocab["[SEP]"], vocab["[CLS]"], vocab["[MASK]"]]
    candidates_mask = tf.ones_like(input_ids, tf.bool)
    for ignore_id in ignore_ids:
        candidates_mask &= tf.not_equal(input_ids, ignore_id)
    candidates_mask &= tf.cast(input_mask, tf.bool)
    return candidates_mask


def electra_mask(tf, vocab, max_predictions_per_seq, input_ids, input_mask, mask_prob,
                 categorical=None, uniform=None):
    categorical = categorical or tf.random.categorical
    uniform = uniform or tf.random.uniform
    N = max_predictions_per_seq
    B, L = input_ids.shape
    candidates_mask = electra_get_candidates_mask(tf, vocab, input_ids, input_mask)
    num_tokens = tf.cast(tf.reduce_sum(input_mask, -1), tf.float32)
    num_to_predict = tf.maximum(1, tf.minimum(N, tf.cast(tf.round(num_tokens * mask_prob), tf.int32)))
    masked_lm_weights = tf.cast(tf.sequence_mask(num_to_predict, N), tf.float32)
    candidate_mask_float = tf.cast(candidates_mask, tf.float32)
    sample_prob = (1.0 * candidate_mask_float)
    sample_prob /= tf.reduce_sum(sample_prob, axis=-1, keepdims=True)
    sample_logits = tf.math.log(sample_prob)
    masked_lm_positions = categorical(sample_logits, N, dtype=tf.int32)
    masked_lm_positions *= tf.cast(masked_lm_weights, tf.int32)
    replace_with_mask_positions = masked_lm_positions * tf.cast(tf.less(uniform([B, N]), 0.85), tf.int32)
    inputs_ids, _ = electra_scatter_update(tf, input_ids, tf.fill([B, N], vocab["[MASK]"]),
                                           replace_with_mask_positions)
    return inputs_ids, masked_lm_positions, masked_lm_weights


@pytest.fixture(scope="module")
def tf():
    tf = pytest.importorskip("tensorflow", reason="ELECTRA's masking code needs the `reference` extra")
    tf.config.set_visible_devices([], "GPU")
    return tf


class _ElectraVocabulary:
    """A WordPiece-like vocabulary with [MASK], [CLS], [SEP] ids for `masking.special_ids`."""
    vocab_size, mask_id, cls_id, sep_id, eos_id, unk_id = 200, 103, 101, 102, 102, 100


def _electra_rows(rng, n, max_seq_length):
    """[CLS] tokens [SEP] rows of random lengths; some hold [UNK] (100), which ELECTRA may mask."""
    rows = []
    for _ in range(n):
        body = rng.integers(100, 200, int(rng.integers(1, max_seq_length - 1)))
        rows.append(np.concatenate([[101], np.where((body >= 101) & (body <= 103), 150, body), [102]]))
    return rows


ELECTRA_FEATURES = {"inputs": type("Feature", (), {"vocabulary": _ElectraVocabulary()})()}
ELECTRA_VOCAB = {"[CLS]": 101, "[SEP]": 102, "[MASK]": 103}


def _padded(rows, length):
    ids = np.zeros((len(rows), length), np.int32)
    for r, row in enumerate(rows):
        ids[r, :len(row)] = row
    return ids, (ids != 0).astype(np.int32)


@pytest.mark.parametrize("max_seq_length", [12, 40, 128])
def test_electra_mlm_equals_electras_mask_on_the_same_draws(tf, max_seq_length):
    """Each row through ELECTRA's `mask` with the two random ops fed the draws t5lite took: the same
    corrupted ids, and t5lite's loss weight per position = ELECTRA's masked_lm_weights summed there."""
    rows = _electra_rows(np.random.default_rng(max_seq_length), 40, max_seq_length)
    ours = list(masking.electra_mlm([{"inputs": r} for r in rows], ELECTRA_FEATURES, {"inputs": max_seq_length},
                                    seed=3))
    cap = int((0.15 + 0.005) * max_seq_length)            # configure_pretraining.py's max_predictions_per_seq
    for i, (row, ex) in enumerate(zip(rows, ours)):
        draws = np.random.default_rng([3, 7, i])          # the generator electra_mlm draws row i from

        def categorical(logits, n, dtype):                # uniform over the candidates, with replacement
            candidates = np.flatnonzero(np.isfinite(logits.numpy()[0]))
            return tf.constant(candidates[draws.integers(len(candidates), size=n)][None], dtype)

        def uniform(shape):
            return tf.constant(draws.random(shape[1])[None], tf.float32)

        ids, mask = _padded([row], max_seq_length)
        input_ids, positions, weights = electra_mask(tf, ELECTRA_VOCAB, cap, tf.constant(ids), tf.constant(mask), 0.15,
                                                     categorical, uniform)
        per_position = np.bincount(positions.numpy()[0], weights.numpy()[0], minlength=max_seq_length)
        np.testing.assert_array_equal(ex["inputs"], input_ids.numpy()[0, :len(row)])
        np.testing.assert_array_equal(ex["targets_loss_weights"], per_position[:len(row)])


def test_electra_mlm_positions_follow_electras_categorical_draws(tf):
    """Where draws cannot be shared: ELECTRA's own tf.random.categorical and t5lite's positions, counted
    per position over many masks of one row, agree within 5 standard errors."""
    row = np.concatenate([[101], np.random.default_rng(5).integers(104, 200, 50), [102]])
    trials, cap = 400, int((0.15 + 0.005) * 64)
    ours = np.zeros(len(row))
    for ex in masking.electra_mlm([{"inputs": row}] * trials, ELECTRA_FEATURES, {"inputs": 64}, seed=0):
        ours += ex["targets_loss_weights"]
    ids, mask = _padded([row] * trials, 64)
    tf.random.set_seed(0)
    _, positions, weights = electra_mask(tf, ELECTRA_VOCAB, cap, tf.constant(ids), tf.constant(mask), 0.15)
    theirs = np.bincount(positions.numpy().ravel(), weights.numpy().ravel(), minlength=64)[:len(row)]
    assert ours.sum() == theirs.sum()
    expected = (ours + theirs) / 2
    assert (np.abs(ours - theirs) <= 5 * np.sqrt(2 * expected) + 1).all(), np.c_[ours, theirs]


# --- facebookresearch/SpanBERT, pretraining/fairseq/data/masking.py: `ParagraphInfo`,
# `PairWithSpanMaskingScheme.mask`, `span_masking`, `merge_intervals`, `pad_to_len`, with `np.random`
# a parameter so t5lite's draws can be fed in, and the dictionary's `is_start_word` as
# pretraining/fairseq/tasks/span_bert.py's BertDictionary has it (not a "##" piece). Arguments: the
# published recipe (pretraining/README.md): span 1-10, geometric-p 0.2, --replacement-method span,
# --endpoints external, --max-pair-targets 15, --tagged-anchor-prob 0 (the default), mask-ratio 0.15.

class SpanBertDictionary:
    def __init__(self, vocabulary):
        self.symbols = [vocabulary.id_to_piece(i) for i in range(vocabulary.vocab_size)]

    def is_start_word(self, idx):
        return not self.symbols[idx].startswith('##')


class ParagraphInfo(object):
    def __init__(self, dictionary):
        self.dictionary = dictionary

    def get_word_piece_map(self, sentence):
        return [self.dictionary.is_start_word(i) for i in sentence]

    def get_word_start(self, sentence, anchor, word_piece_map=None):
        word_piece_map = word_piece_map if word_piece_map is not None else self.get_word_piece_map(sentence)
        left = anchor
        while left > 0 and word_piece_map[left] == False:  # noqa: E712
            left -= 1
        return left

    def get_word_end(self, sentence, anchor, word_piece_map=None):
        word_piece_map = word_piece_map if word_piece_map is not None else self.get_word_piece_map(sentence)
        right = anchor + 1
        while right < len(sentence) and word_piece_map[right] == False:  # noqa: E712
            right += 1
        return right


def spanbert_pair_with_span_mask(sentence, paragraph_info, tokens, pad, mask_id, random, mask_ratio=0.15,
                                 lower=1, upper=10, p=0.2, max_pair_targets=15):
    """`PairWithSpanMaskingScheme.__init__` and `.mask` (tagmap None, so tagged_indices stays None)."""
    lens = list(range(lower, upper + 1))
    len_distrib = [p * (1 - p) ** (i - lower) for i in range(lower, upper + 1)] if p >= 0 else None
    len_distrib = [x / (sum(len_distrib)) for x in len_distrib]
    tagged_anchor_prob = 0.0
    sent_length = len(sentence)
    mask_num = math.ceil(sent_length * mask_ratio)
    mask = set()
    word_piece_map = paragraph_info.get_word_piece_map(sentence)
    spans = []
    while len(mask) < mask_num:
        span_len = random.choice(lens, p=len_distrib)
        tagged_indices = None
        anchor = random.choice(sent_length) if random.rand() >= tagged_anchor_prob else random.choice(tagged_indices)
        if anchor in mask:
            continue
        left1, right1 = (paragraph_info.get_word_start(sentence, anchor, word_piece_map),
                         paragraph_info.get_word_end(sentence, anchor, word_piece_map))
        spans.append([left1, left1])
        for i in range(left1, right1):
            if len(mask) >= mask_num:
                break
            mask.add(i)
            spans[-1][-1] = i
        num_words = 1
        right2 = right1
        while num_words < span_len and right2 < len(sentence) and len(mask) < mask_num:
            left2 = right2
            right2 = paragraph_info.get_word_end(sentence, right2, word_piece_map)
            num_words += 1
            for i in range(left2, right2):
                if len(mask) >= mask_num:
                    break
                mask.add(i)
                spans[-1][-1] = i
    return spanbert_span_masking(sentence, spans, tokens, pad, mask_id, max_pair_targets, mask, random,
                                 replacement='span', endpoints='external')


def spanbert_span_masking(sentence, spans, tokens, pad, mask_id, pad_len, mask, random, replacement='word_piece',
                          endpoints='external'):
    sentence = np.copy(sentence)
    sent_length = len(sentence)
    target = np.full(sent_length, pad)
    pair_targets = []
    spans = spanbert_merge_intervals(spans)
    assert len(mask) == sum([e - s + 1 for s, e in spans])
    for start, end in spans:
        lower_limit = 0 if endpoints == 'external' else -1
        upper_limit = sent_length - 1 if endpoints == 'external' else sent_length
        if start > lower_limit and end < upper_limit:
            if endpoints == 'external':
                pair_targets += [[start - 1, end + 1]]
            else:
                pair_targets += [[start, end]]
            pair_targets[-1] += [sentence[i] for i in range(start, end + 1)]
        rand = random.random()
        for i in range(start, end + 1):
            assert i in mask
            target[i] = sentence[i]
            if replacement == 'word_piece':
                rand = random.random()
            if rand < 0.8:
                sentence[i] = mask_id
            elif rand < 0.9:
                sentence[i] = random.choice(tokens)
    pair_targets = spanbert_pad_to_len(pair_targets, pad, pad_len + 2)
    return sentence, target, pair_targets


def spanbert_merge_intervals(intervals):
    intervals = sorted(intervals, key=lambda x: x[0])
    merged = []
    for interval in intervals:
        if not merged or merged[-1][1] + 1 < interval[0]:
            merged.append(interval)
        else:
            merged[-1][1] = max(merged[-1][1], interval[1])
    return merged


def spanbert_pad_to_len(pair_targets, pad, max_pair_target_len):
    for i in range(len(pair_targets)):
        pair_targets[i] = pair_targets[i][:max_pair_target_len]
        this_len = len(pair_targets[i])
        for j in range(max_pair_target_len - this_len):
            pair_targets[i].append(pad)
    return pair_targets


class NumpyRandom:
    """np.random's calls that SpanBERT makes, over a numpy Generator's stream so t5lite (which calls the
    Generator's `choice(values, p=...)`, `integers` and `random`) shares every draw. `rand()` only
    decides the tagged anchor, which --tagged-anchor-prob 0 never takes whatever it returns: it
    returns 1.0 without a draw."""

    def __init__(self, seed):
        self._rng = np.random.default_rng(seed)

    def choice(self, a, p=None):
        if p is not None:
            return self._rng.choice(a, p=p)
        return int(self._rng.integers(a)) if np.ndim(a) == 0 else a[int(self._rng.integers(len(a)))]

    def rand(self):
        return 1.0

    def random(self):
        return self._rng.random()


@pytest.mark.parametrize("seed", range(40))
def test_spanbert_mlm_equals_spanberts_pair_with_span_masking_on_the_same_draws(seed):
    """[CLS] block [SEP] through t5lite's spanbert_mlm and the block through SpanBERT's scheme (as its
    NoNSPSpanBertDataset does, then shifted by the [CLS]): the same corrupted tokens, MLM targets, and
    SBO inputs (a token's pair target: its span's boundaries and its position among the first 15)."""
    vocabulary = PieceVocabulary(wordpiece=True)
    rng = np.random.default_rng(3000 + seed)
    block = rng.integers(3, vocabulary.vocab_size - vocabulary.extra_ids, int(rng.integers(1, 200)))
    if seed % 4 == 0:
        block[: rng.integers(1, 4)] = 4                  # the block opens inside a word
    mask_id, cls, sep = masking.special_ids(vocabulary)["mask"], 1001, 1002
    (ours,) = masking.spanbert_mlm([{"inputs": np.concatenate([[cls], block, [sep]])}], features(vocabulary), seed)
    pool = masking.random_pool(vocabulary)
    theirs, target, pair_targets = spanbert_pair_with_span_mask(
        block, ParagraphInfo(SpanBertDictionary(vocabulary)), pool, 0, mask_id, NumpyRandom([seed, 4, 0]))
    np.testing.assert_array_equal(ours["inputs"][1:-1], theirs)
    np.testing.assert_array_equal(ours["targets_loss_weights"][1:-1], target != 0)
    relative, left, right = (np.zeros(len(block), int) for _ in range(3))
    for pair in pair_targets:                            # [start - 1, end + 1, the span's first 15 tokens]
        count = sum(t != 0 for t in pair[2:])
        relative[pair[0] + 1:pair[0] + 1 + count] = np.arange(1, count + 1)
        left[pair[0] + 1:pair[0] + 1 + count], right[pair[0] + 1:pair[0] + 1 + count] = pair[0], pair[1]
    np.testing.assert_array_equal(ours["span_relative_position"][1:-1], relative)
    np.testing.assert_array_equal(ours["span_left_boundary"][1:-1], np.where(relative > 0, left + 1, 0))
    np.testing.assert_array_equal(ours["span_right_boundary"][1:-1], np.where(relative > 0, right + 1, 0))
