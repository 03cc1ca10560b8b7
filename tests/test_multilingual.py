"""Several languages at once: XLM's alpha-smoothed language sampling, checked against a
transcription of XLM's code and by drawing from a mixture."""
import collections
import itertools

import numpy as np
import pytest

from t5lite.data import FunctionSource, MixtureRegistry, TaskRegistry
from t5lite.data.registry import ExamplesProportional, smoothed_rates
from t5lite.errors import ConfigError

LANGUAGE_SIZES = {"lang_en": 20_000, "lang_de": 2_000, "lang_ro": 200}


def xlm_set_sampling_probs(sentences_per_language, coeff):
    """facebookresearch/XLM, xlm/utils.py, `set_sampling_probs` (monolingual part), transcribed: the
    languages' train sizes, normalised, raised to --lg_sampling_factor, normalised again; `shuf_order`
    then draws the languages with these probabilities."""
    probs = np.array([1.0 * n for n in sentences_per_language])
    probs /= probs.sum()
    probs = np.array([p ** coeff for p in probs])
    probs /= probs.sum()
    return probs


@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.7, 1.0, 2.0])
def test_smoothed_rates_match_xlm(alpha):
    sizes = [1_000_000, 50_000, 3_000, 7]
    np.testing.assert_allclose(smoothed_rates(sizes, alpha), xlm_set_sampling_probs(sizes, alpha), rtol=1e-12)


def test_smoothed_rates_refuse_a_non_positive_alpha():
    with pytest.raises(ConfigError, match="alpha=0"):
        smoothed_rates([1, 2], 0)


@pytest.fixture(scope="module")
def languages():
    """Three one-field tasks of very different sizes, standing for monolingual corpora."""
    for name, size in LANGUAGE_SIZES.items():
        TaskRegistry.add(name, FunctionSource(lambda split, n=size, name=name: [{"language": name}] * n), [], {})
    yield list(LANGUAGE_SIZES)
    for name in LANGUAGE_SIZES:
        TaskRegistry.remove(name)


@pytest.mark.parametrize("alpha", [0.3, 0.5, 1.0])
def test_mixture_draws_languages_with_xlm_probabilities(languages, alpha):
    MixtureRegistry.remove("xlm_languages")
    mixture = MixtureRegistry.add("xlm_languages", [(name, ExamplesProportional()) for name in languages], alpha=alpha)
    expected = xlm_set_sampling_probs(list(LANGUAGE_SIZES.values()), alpha)
    draws = 20_000
    counts = collections.Counter(ex["language"] for ex in itertools.islice(mixture.get_dataset("train", seed=3), draws))
    observed = np.array([counts[name] for name in languages]) / draws
    sigma = np.sqrt(expected * (1 - expected) / draws)    # the binomial's standard deviation of a share
    assert np.all(np.abs(observed - expected) < 4.5 * sigma), (observed, expected)
    assert f"alpha={alpha}" in repr(mixture) or alpha == 1.0


def test_mixture_refuses_a_bad_alpha_when_registered(languages):
    with pytest.raises(ConfigError, match="alpha=-1"):
        MixtureRegistry.add("xlm_bad_alpha", [(name, 1.0) for name in languages], alpha=-1)


# --- Fake-English: the construction against Dufter & Schütze's code, and the retrieval it is measured by.

def minimult_shift_example(original, do_not_shift, shift):
    """pdufter/minimult, shift.py, `shift_example`, transcribed."""
    return [x if x in do_not_shift else x + shift for x in original]


def minimult_language_specific_positions(row, shift, max_length):
    """pdufter/minimult, modifyinput.py, `get_language_specific_positions` for one row: positions
    0.. plus max_length and token type 1 when the row holds a shifted id (`get_is_shifted`)."""
    is_shifted = not all(x < shift for x in row)
    return np.arange(len(row)) + is_shifted * max_length, np.zeros(len(row), int) + is_shifted


def minimult_shift_special_tokens(row, shift, special_token_indices):
    """pdufter/minimult, modifyinput.py, `shift_special_tokens` for one row (after `shift_example`)."""
    is_shifted = not all(x < shift for x in row)
    return [x + shift if is_shifted and x in special_token_indices else x for x in row]


def _masked_twins(share_special, share_positions, length=40):
    from t5lite.data import fake_english
    from t5lite.data.corruption import masking
    from t5lite.data.tasks.pretraining import FEATURES
    vocabulary = FEATURES["inputs"].vocabulary
    ids = masking.special_ids(vocabulary)
    rng = np.random.default_rng(0)
    examples = [{"inputs": np.array([ids["cls"], *rng.integers(3, 1900, length - 2), ids["sep"]], np.int32)}
                for _ in range(3)]
    for ex in examples:
        ex["targets"] = ex["inputs"]
    masked = masking.bert_mlm(fake_english.twins(examples), FEATURES, seed=1)
    out = list(fake_english.fake_english(masked, {"inputs": 64}, FEATURES, share_special, share_positions))
    return vocabulary, ids, out


@pytest.mark.parametrize("share_special", [True, False])
@pytest.mark.parametrize("share_positions", [True, False])
def test_fake_english_is_minimults_construction(share_special, share_positions):
    vocabulary, ids, out = _masked_twins(share_special, share_positions)
    shift = vocabulary.vocab_size
    special_token_indices = {ids["cls"], ids["sep"], ids["mask"], vocabulary.unk_id, vocabulary.pad_id}
    english, fake = out[0::2], out[1::2]
    assert [ex["language"] for ex in out] == [0, 1] * 3
    for en, fk in zip(english, fake):
        expected = minimult_shift_example(en["targets"].tolist(), special_token_indices, shift)
        if not share_special:
            expected = minimult_shift_special_tokens(expected, shift, special_token_indices)
        assert fk["targets"].tolist() == expected
        assert en["targets"].max() < shift                               # English is left as it is
        for ex in (en, fk):
            positions, types = minimult_language_specific_positions(ex["targets"].tolist(), shift, 64)
            if share_positions:
                positions, types = np.arange(len(ex["targets"])), np.zeros(len(ex["targets"]))
            np.testing.assert_array_equal(ex["positions"], positions)
            np.testing.assert_array_equal(ex["token_type_ids"], types)
    # The twins are masked independently, as two examples of minimult's dataset are.
    assert any((en["targets_loss_weights"] != fk["targets_loss_weights"]).any() for en, fk in zip(english, fake))
    assert all(((fk["inputs"] >= shift) | np.isin(fk["inputs"], list(special_token_indices))).all() for fk in fake)


def test_encoder_positions_converter_keeps_the_examples_positions():
    from t5lite.data.converter_registry import get_feature_converter
    from t5lite.errors import ConfigError as Refused
    _, _, out = _masked_twins(True, False)
    converter = get_feature_converter("encoder_positions")
    rows = list(converter.convert(out[:2], {"inputs": 48}))
    assert rows[0]["encoder_positions"][:40].tolist() == list(range(40))
    assert rows[1]["encoder_positions"][:40].tolist() == list(range(64, 104))
    assert set(converter.model_feature_lengths({"inputs": 48})) >= {"encoder_positions", "encoder_input_tokens"}
    with pytest.raises(Refused, match="train.pack = False"):
        list(converter.convert(out[:2], {"inputs": 48}, pack=True))


@pytest.fixture(scope="module")
def twin_embedding_model():
    """An untrained bert_tiny for English + Fake-English whose Fake token embeddings are copies of the
    English ones: with every anchor shared, the two languages' pieces read identically."""
    import dataclasses
    from t5lite import models
    from t5lite.analysis import loading
    from t5lite.data.tasks.pretraining import FEATURES
    vocabulary = FEATURES["inputs"].vocabulary
    config = models.get_config("bert_tiny").replace(vocab_size=4224, max_position_embeddings=128,
                                                    **loading.READABLE)
    subject = loading.untrained(loading.Subject(models.build(config), {}, vocabulary, "twins"))
    params = subject.variables["params"]
    table = np.array(params["token_embedder"]["embedding"])
    shift = vocabulary.vocab_size
    table[shift:2 * shift] = table[:shift]
    params["token_embedder"]["embedding"] = table
    return dataclasses.replace(subject, variables={"params": params})


def test_cross_lingual_retrieval_finds_twins_through_shared_anchors(twin_embedding_model):
    from t5lite.analysis import cross_lingual
    ids = cross_lingual.pieces(twin_embedding_model)[:120]
    shared = cross_lingual.retrieval(twin_embedding_model, ids)
    assert [layer["english_to_fake"] for layer in shared["layers"]] == [1.0] * 3
    assert [layer["fake_to_english"] for layer in shared["layers"]] == [1.0] * 3
    # Fake-English's own [CLS], [SEP] and positions (other random rows) move its pieces' vectors away.
    apart = cross_lingual.retrieval(twin_embedding_model, ids, share_special=False, share_positions=False)
    assert all(layer["english_to_fake"] < 1.0 for layer in apart["layers"]) and apart["chance"] == 1 / 120
