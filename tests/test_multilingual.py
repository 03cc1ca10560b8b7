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
