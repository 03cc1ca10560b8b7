"""BART's noise (layout "fairseq") against fairseq's own code, transcribed here (fairseq does not
install here): facebookresearch/fairseq, fairseq/data/denoising_dataset.py, `DenoisingDataset`
(`__init__`'s span distribution, `__getitem__`'s order, `permute_sentences`, `word_starts`,
`add_whole_word_mask`, `add_insertion_noise`, `add_rolling_noise`), with the word-start table of
fairseq/data/encoders/utils.py `get_whole_word_mask` and sentencepiece_bpe.py `is_beginning_of_word`.

Both sides take the same random draws: fairseq's torch and numpy calls are routed, one for one, to a
numpy Generator seeded as t5lite's (`draws_from`). fairseq's document is t5lite's with <s> and </s>
around it. The token streams use no special ids (fairseq counts them as word starts, t5lite's table
reads the pieces)."""
import math

import numpy as np
import pytest
import torch

from objectives_helpers import PieceVocabulary, features
from t5lite.data.corruption import bart_noise as B
from t5lite.data.corruption.masking import special_ids

BOS, EOS, FULL_STOP = 0, 1, 7


class StopVocabulary(PieceVocabulary):
    """PieceVocabulary with one "." piece (id 7), fairseq's full stop for GPT-2 BPE."""

    def id_to_piece(self, i: int) -> str:
        return "." if i == FULL_STOP else super().id_to_piece(i)


VOCAB = StopVocabulary()
MASK = special_ids(VOCAB)["mask"]
NSPECIAL = 3   # pad, </s>, <unk>


def mask_whole_words(vocabulary):
    """fairseq/data/encoders/utils.py get_whole_word_mask, with sentencepiece_bpe's is_beginning_of_word."""
    def is_beginning_of_word(i):
        if i < NSPECIAL:
            return True
        tok = vocabulary.id_to_piece(i)
        if tok in ['<unk>', '<s>', '</s>', '<pad>']:
            return True
        return tok.startswith('\u2581')
    return torch.ByteTensor(list(map(is_beginning_of_word, range(vocabulary.vocab_size))))


class FairseqDenoising:
    """fairseq/data/denoising_dataset.py DenoisingDataset: the constructor's settings as arguments,
    `noise` is `__getitem__`'s body without numpy_seed (the draws come from `draws_from`)."""

    def __init__(self, vocab_size, mask_idx, mask_whole_words, mask, mask_random, insert, rotate,
                 permute_sentences, poisson_lambda, mask_length, replace_length):
        self.vocab_size, self.mask_idx, self.mask_whole_word = vocab_size, mask_idx, mask_whole_words
        self.mask_ratio, self.random_ratio, self.insert_ratio = mask, mask_random, insert
        self.rotate_ratio, self.permute_sentence_ratio = rotate, permute_sentences
        self.full_stop_index, self.replace_length = FULL_STOP, replace_length
        self.mask_span_distribution = None
        if mask_length == 'span-poisson':
            _lambda = poisson_lambda

            lambda_to_the_k = 1
            e_to_the_minus_lambda = math.exp(-_lambda)
            k_factorial = 1
            ps = []
            for k in range(0, 128):
                ps.append(e_to_the_minus_lambda * lambda_to_the_k / k_factorial)
                lambda_to_the_k *= _lambda
                k_factorial *= (k + 1)
                if ps[-1] < 0.0000001:
                    break
            ps = torch.FloatTensor(ps)
            self.mask_span_distribution = torch.distributions.Categorical(ps)

    def noise(self, tokens):
        source = tokens.clone()
        if self.permute_sentence_ratio > 0.0:
            source = self.permute_sentences(source, self.permute_sentence_ratio)

        if self.mask_ratio > 0:
            source = self.add_whole_word_mask(source, self.mask_ratio)

        if self.insert_ratio > 0:
            source = self.add_insertion_noise(source, self.insert_ratio)

        if self.rotate_ratio > 0.0 and np.random.random() < self.rotate_ratio:
            source = self.add_rolling_noise(source)
        return source

    def permute_sentences(self, source, p=1.0):
        full_stops = (source == self.full_stop_index)
        # Pretend it ends with a full stop so last span is a sentence
        full_stops[-2] = 1

        # Tokens that are full stops, where the previous token is not
        sentence_ends = (full_stops[1:] * ~full_stops[:-1]).nonzero(as_tuple=False) + 2
        result = source.clone()

        num_sentences = sentence_ends.size(0)
        num_to_permute = math.ceil((num_sentences * 2 * p) / 2.0)
        substitutions = torch.randperm(num_sentences)[:num_to_permute]
        ordering = torch.arange(0, num_sentences)
        ordering[substitutions] = substitutions[torch.randperm(num_to_permute)]

        # Ignore <bos> at start
        index = 1
        for i in ordering:
            sentence = source[(sentence_ends[i - 1] if i > 0 else 1):sentence_ends[i]]
            result[index:index + sentence.size(0)] = sentence
            index += sentence.size(0)
        return result

    def word_starts(self, source):
        if self.mask_whole_word is not None:
            is_word_start = self.mask_whole_word.gather(0, source)
        else:
            is_word_start = torch.ones(source.size())
        is_word_start[0] = 0
        is_word_start[-1] = 0
        return is_word_start

    def add_whole_word_mask(self, source, p):
        is_word_start = self.word_starts(source)
        num_to_mask = int(math.ceil(is_word_start.float().sum() * p))
        num_inserts = 0
        if num_to_mask == 0:
            return source

        if self.mask_span_distribution is not None:
            lengths = self.mask_span_distribution.sample(sample_shape=(num_to_mask,))

            # Make sure we have enough to mask
            cum_length = torch.cumsum(lengths, 0)
            while cum_length[-1] < num_to_mask:
                lengths = torch.cat([lengths, self.mask_span_distribution.sample(sample_shape=(num_to_mask,))], dim=0)
                cum_length = torch.cumsum(lengths, 0)

            # Trim to masking budget
            i = 0
            while cum_length[i] < num_to_mask:
                i += 1
            lengths[i] = num_to_mask - (0 if i == 0 else cum_length[i - 1])
            num_to_mask = i + 1
            lengths = lengths[:num_to_mask]

            # Handle 0-length mask (inserts) separately
            lengths = lengths[lengths > 0]
            num_inserts = num_to_mask - lengths.size(0)
            num_to_mask -= num_inserts
            if num_to_mask == 0:
                return self.add_insertion_noise(source, num_inserts / source.size(0))

            assert (lengths > 0).all()
        else:
            lengths = torch.ones((num_to_mask,)).long()
        assert is_word_start[-1] == 0
        word_starts = is_word_start.nonzero(as_tuple=False)
        indices = word_starts[torch.randperm(word_starts.size(0))[:num_to_mask]].squeeze(1)
        mask_random = torch.FloatTensor(num_to_mask).uniform_() < self.random_ratio

        source_length = source.size(0)
        assert source_length - 1 not in indices
        to_keep = torch.ones(source_length, dtype=torch.bool)
        is_word_start[-1] = 255  # acts as a long length, so spans don't go over the end of doc
        if self.replace_length == 0:
            to_keep[indices] = 0
        else:
            # keep index, but replace it with [MASK]
            source[indices] = self.mask_idx
            source[indices[mask_random]] = torch.randint(1, self.vocab_size, size=(mask_random.sum(),))

        if self.mask_span_distribution is not None:
            assert len(lengths.size()) == 1
            assert lengths.size() == indices.size()
            lengths -= 1
            while indices.size(0) > 0:
                assert lengths.size() == indices.size()
                lengths -= is_word_start[indices + 1].long()
                uncompleted = lengths >= 0
                indices = indices[uncompleted] + 1
                mask_random = mask_random[uncompleted]
                lengths = lengths[uncompleted]
                if self.replace_length != -1:
                    # delete token
                    to_keep[indices] = 0
                else:
                    # keep index, but replace it with [MASK]
                    source[indices] = self.mask_idx
                    source[indices[mask_random]] = torch.randint(1, self.vocab_size, size=(mask_random.sum(),))
        else:
            # A bit faster when all lengths are 1
            while indices.size(0) > 0:
                uncompleted = is_word_start[indices + 1] == 0
                indices = indices[uncompleted] + 1
                mask_random = mask_random[uncompleted]
                if self.replace_length != -1:
                    # delete token
                    to_keep[indices] = 0
                else:
                    # keep index, but replace it with [MASK]
                    source[indices] = self.mask_idx
                    source[indices[mask_random]] = torch.randint(1, self.vocab_size, size=(mask_random.sum(),))

                assert source_length - 1 not in indices

        source = source[to_keep]

        if num_inserts > 0:
            source = self.add_insertion_noise(source, num_inserts / source.size(0))

        return source

    def add_rolling_noise(self, tokens):
        offset = np.random.randint(1, max(1, tokens.size(-1) - 1) + 1)
        tokens = torch.cat(
            (tokens[0:1], tokens[offset:-1], tokens[1:offset], tokens[-1:]),
            dim=0,
        )
        return tokens

    def add_insertion_noise(self, tokens, p):
        if p == 0.0:
            return tokens

        num_tokens = len(tokens)
        n = int(math.ceil(num_tokens * p))

        noise_indices = torch.randperm(num_tokens + n - 2)[:n] + 1
        noise_mask = torch.zeros(size=(num_tokens + n,), dtype=torch.bool)
        noise_mask[noise_indices] = 1
        result = torch.LongTensor(n + len(tokens)).fill_(-1)

        num_random = int(math.ceil(n * self.random_ratio))
        result[noise_indices[num_random:]] = self.mask_idx
        result[noise_indices[:num_random]] = torch.randint(low=1, high=self.vocab_size, size=(num_random,))

        result[~noise_mask] = tokens

        assert (result >= 0).all()
        return result


def draws_from(rng, monkeypatch):
    """fairseq's random calls answered from `rng`, each by the Generator call t5lite makes in its place."""
    def categorical_sample(self, sample_shape=torch.Size()):
        probs = self.probs.double().numpy()
        return torch.from_numpy(rng.choice(len(probs), size=tuple(sample_shape), p=probs / probs.sum()))

    def uniform_(self, a=0.0, b=1.0):
        assert (a, b) == (0.0, 1.0)
        return self.copy_(torch.from_numpy(rng.random(tuple(self.shape))))

    def randint(low, high, size):
        return torch.from_numpy(rng.integers(low, high, size=int(size[0])))

    monkeypatch.setattr(torch, "randperm", lambda n: torch.from_numpy(rng.permutation(int(n))))
    monkeypatch.setattr(torch, "randint", randint)
    monkeypatch.setattr(torch.distributions.Categorical, "sample", categorical_sample)
    monkeypatch.setattr(torch.Tensor, "uniform_", uniform_)
    monkeypatch.setattr(np.random, "random", lambda: rng.random())
    monkeypatch.setattr(np.random, "randint", lambda low, high: rng.integers(low, high))


def document(seed):
    """Regular ids with frequent full stops (and runs of them), some documents empty or one token long."""
    rng = np.random.default_rng(10_000 + seed)
    length = int(rng.choice([0, 1, 2, int(rng.integers(3, 200))], p=[0.05, 0.05, 0.05, 0.85]))
    tokens = rng.integers(3, 190, size=length)
    tokens[rng.random(length) < 0.12] = FULL_STOP
    return tokens.astype(np.int32)


SETTINGS = {   # (fairseq arguments, t5lite's bart_denoise arguments)
    "bart_published": (dict(mask=0.3, mask_random=0.1, insert=0.0, rotate=0.0, permute_sentences=1.0,
                            poisson_lambda=3.5, mask_length='span-poisson', replace_length=1), {}),
    "all_steps": (dict(mask=0.4, mask_random=0.3, insert=0.1, rotate=0.5, permute_sentences=0.5,
                       poisson_lambda=2.0, mask_length='span-poisson', replace_length=1),
                  dict(mask_ratio=0.4, random_ratio=0.3, insert_ratio=0.1, rotate_ratio=0.5,
                       permute_sentence_ratio=0.5, poisson_lambda=2.0)),
    "span_delete": (dict(mask=0.3, mask_random=0.1, insert=0.0, rotate=0.0, permute_sentences=0.0,
                         poisson_lambda=3.5, mask_length='span-poisson', replace_length=0),
                    dict(permute_sentence_ratio=0.0, replace_length=0)),
    "span_every_token": (dict(mask=0.3, mask_random=0.2, insert=0.0, rotate=0.0, permute_sentences=0.0,
                              poisson_lambda=3.5, mask_length='span-poisson', replace_length=-1),
                         dict(permute_sentence_ratio=0.0, random_ratio=0.2, replace_length=-1)),
    "subword": (dict(mask=0.15, mask_random=0.1, insert=0.0, rotate=0.0, permute_sentences=0.0,
                     poisson_lambda=3.0, mask_length='subword', replace_length=1),
                dict(mask_ratio=0.15, permute_sentence_ratio=0.0, mask_length="token")),
}


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("seed", range(30))
def test_bart_denoise_equals_fairseqs_denoising_dataset(setting, seed, monkeypatch):
    fairseq_args, ours = SETTINGS[setting]
    tokens = document(seed)
    (example,) = B.bart_denoise([{"targets": tokens}], features(VOCAB), seed, **ours)
    words = mask_whole_words(VOCAB) if fairseq_args["mask_length"] != 'subword' else None
    fairseq = FairseqDenoising(VOCAB.vocab_size, MASK, words, **fairseq_args)
    draws_from(np.random.default_rng([seed, 5, 0]), monkeypatch)
    theirs = fairseq.noise(torch.from_numpy(np.concatenate([[BOS], tokens, [EOS]]).astype(np.int64)))
    assert [BOS, *example["inputs"].tolist(), EOS] == theirs.tolist()
    assert example["targets"].tolist() == tokens.tolist()


@pytest.mark.parametrize("poisson_lambda", [3.0, 3.5, 0.5, 12.0])
def test_span_distribution_equals_fairseqs(poisson_lambda):
    words = mask_whole_words(VOCAB)
    fairseq = FairseqDenoising(VOCAB.vocab_size, MASK, words, 0.3, 0.1, 0.0, 0.0, 1.0, poisson_lambda,
                               'span-poisson', 1)
    theirs = fairseq.mask_span_distribution.probs.numpy()
    np.testing.assert_allclose(B.fairseq_span_distribution(poisson_lambda), theirs, rtol=1e-6)
