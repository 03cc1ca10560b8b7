"""BERT's masked LM against google-research/bert, create_pretraining_data.py:
`create_masked_lm_predictions`, transcribed below (FLAGS.do_whole_word_mask made an argument),
run on the same [CLS] A [SEP] B [SEP] sequences of a BERT vocab.txt and driven by the same uniform
draws as t5lite's `bert_mlm`."""
import collections

import numpy as np
import pytest

from t5lite.data.corruption import masking
from t5lite.data.wordpiece import SPECIAL_TOKENS, WordPieceVocabulary
from test_reference_corruption import Draws as UniformDraws

MaskedLmInstance = collections.namedtuple("MaskedLmInstance", ["index", "label"])


def create_masked_lm_predictions(tokens, masked_lm_prob, max_predictions_per_seq, vocab_words, rng,
                                 do_whole_word_mask):
    cand_indexes = []
    for (i, token) in enumerate(tokens):
        if token == "[CLS]" or token == "[SEP]":
            continue
        if (do_whole_word_mask and len(cand_indexes) >= 1 and
                token.startswith("##")):
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])

    rng.shuffle(cand_indexes)

    output_tokens = list(tokens)

    num_to_predict = min(max_predictions_per_seq,
                         max(1, int(round(len(tokens) * masked_lm_prob))))

    masked_lms = []
    covered_indexes = set()
    for index_set in cand_indexes:
        if len(masked_lms) >= num_to_predict:
            break
        if len(masked_lms) + len(index_set) > num_to_predict:
            continue
        is_any_index_covered = False
        for index in index_set:
            if index in covered_indexes:
                is_any_index_covered = True
                break
        if is_any_index_covered:
            continue
        for index in index_set:
            covered_indexes.add(index)

            masked_token = None
            if rng.random() < 0.8:
                masked_token = "[MASK]"
            else:
                if rng.random() < 0.5:
                    masked_token = tokens[index]
                else:
                    masked_token = vocab_words[rng.randint(0, len(vocab_words) - 1)]

            output_tokens[index] = masked_token

            masked_lms.append(MaskedLmInstance(index=index, label=tokens[index]))
    assert len(masked_lms) <= num_to_predict
    masked_lms = sorted(masked_lms, key=lambda x: x.index)

    masked_lm_positions = []
    masked_lm_labels = []
    for p in masked_lms:
        masked_lm_positions.append(p.index)
        masked_lm_labels.append(p.label)

    return (output_tokens, masked_lm_positions, masked_lm_labels)


class Draws(UniformDraws):
    """Every draw either side makes, from the one stream of uniforms u: an integer below n is
    floor(u * n) (Python's `randint(a, b)`, numpy's `integers(n, size)`), and a shuffle is Python's
    `random.shuffle` Fisher-Yates (numpy's `permutation(n)` shuffles range(n) the same way)."""

    def _below(self, n):
        return int(self.random() * n)

    def randint(self, a, b):
        return a + self._below(b - a + 1)

    def integers(self, n, size):
        return np.array([self._below(n) for _ in range(size)])

    def shuffle(self, x):
        for i in reversed(range(1, len(x))):
            j = self._below(i + 1)
            x[i], x[j] = x[j], x[i]

    def permutation(self, n):
        order = list(range(n))
        self.shuffle(order)
        return np.array(order)


@pytest.fixture(scope="module")
def vocab_words(tmp_path_factory):
    """A BERT vocab.txt: the special tokens, [unused] placeholders, words and "##" continuations."""
    words = [*SPECIAL_TOKENS, *(f"[unused{i}]" for i in range(5)), *(f"w{i}" for i in range(60)),
             *(f"##x{i}" for i in range(40))]
    path = tmp_path_factory.mktemp("bert") / "vocab.txt"
    path.write_text("\n".join(words) + "\n")
    return words, WordPieceVocabulary(str(path))


def pair(rng, words):
    """[CLS] A [SEP] B [SEP] of random pieces; A and B start with a word (not "##": see `word_ids`),
    and hold no [UNK] (t5lite never masks it; BERT's candidates are everything but [CLS]/[SEP])."""
    starts = [w for w in words if w.startswith("w")]
    pieces = starts + [w for w in words if w.startswith("##")]
    segment = lambda: [str(rng.choice(starts)), *rng.choice(pieces, int(rng.integers(0, 150))).tolist()]
    return ["[CLS]", *segment(), "[SEP]", *segment(), "[SEP]"]


def t5lites(tokens, vocabulary, seed, monkeypatch, **options):
    """`bert_mlm` on the ids of `tokens`, its mask drawn from Draws(seed)."""
    monkeypatch.setattr(masking, "_mask_rngs", lambda *args: [Draws(seed)])
    ids = np.array([vocabulary._tokenizer.token_to_id(t) for t in tokens], np.int32)
    feature = type("Feature", (), {"vocabulary": vocabulary})
    (ex,) = masking.bert_mlm([{"inputs": ids}], {"inputs": feature}, 0, **options)
    return [vocabulary.id_to_piece(i) for i in ex["inputs"]], np.flatnonzero(ex["targets_loss_weights"]).tolist()


@pytest.mark.parametrize("seed", range(40))
def test_bert_mlm_equals_berts_create_masked_lm_predictions(seed, vocab_words, monkeypatch):
    words, vocabulary = vocab_words
    tokens = pair(np.random.default_rng(seed), words)
    whole_word, cap = seed % 2 == 0, (20, 80, None)[seed % 3]
    theirs, positions, labels = create_masked_lm_predictions(tokens, 0.15, cap or len(tokens), words, Draws(seed),
                                                             whole_word)
    ours, chosen = t5lites(tokens, vocabulary, seed, monkeypatch, whole_word=whole_word,
                           max_predictions_per_seq=cap, random_from="vocabulary")
    assert (ours, chosen) == (theirs, positions)
    assert [tokens[i] for i in chosen] == labels


@pytest.mark.parametrize("seed", range(10))
def test_default_pool_is_berts_draw_from_the_non_special_words(seed, vocab_words, monkeypatch):
    """The default `random_from="non_special"` is BERT's code given a vocab_words without [PAD],
    [UNK], [CLS], [SEP] and [MASK]; the [unused] placeholders stay (they are not special ids)."""
    words, vocabulary = vocab_words
    tokens = pair(np.random.default_rng(seed), words)
    regular = [w for w in words if w not in SPECIAL_TOKENS]
    theirs, positions, _ = create_masked_lm_predictions(tokens, 0.15, len(tokens), regular, Draws(seed), True)
    assert t5lites(tokens, vocabulary, seed, monkeypatch) == (theirs, positions)


def test_the_cap_binds_only_past_its_length(vocab_words, monkeypatch):
    """BERT's README pairs 20 with 128 tokens: round(0.15 x 128) = 19 is under it, so no cap (the
    default) gives the same count there, and more on a longer sequence where 20 would bind."""
    words, vocabulary = vocab_words
    short = ["[CLS]", *["w1"] * 126, "[SEP]"]
    long = ["[CLS]", *["w1"] * 510, "[SEP]"]
    count = lambda tokens, **options: len(t5lites(tokens, vocabulary, 0, monkeypatch, **options)[1])
    assert count(short) == count(short, max_predictions_per_seq=20) == 19
    assert (count(long), count(long, max_predictions_per_seq=20)) == (77, 20)


def test_an_unknown_random_pool_is_refused_in_one_line(vocab_words):
    _, vocabulary = vocab_words
    feature = type("Feature", (), {"vocabulary": vocabulary})
    with pytest.raises(ValueError, match="random_from='all' is not a random-token pool; use one of"):
        next(masking.bert_mlm([{"inputs": np.array([2, 20, 3])}], {"inputs": feature}, 0, random_from="all"))
