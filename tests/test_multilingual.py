"""Several languages at once, each piece against its source's code: XLM's alpha-smoothed language
sampling (and a mixture's draws), its translation LM, Fake-English and its zero-shot evaluation
(minimult), a vocabulary learnt on XLM-sampled sentences, and XTREME's sentence retrieval."""
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


@pytest.mark.parametrize("alpha", [0.3, 0.5])
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


# --- XLM's translation LM: the stream layout and the masking, against XLM's code.

def xlm_concat_batches(x1, len1, lang1_id, x2, len2, lang2_id, pad_idx, eos_idx, reset_positions):
    """facebookresearch/XLM, xlm/utils.py, `concat_batches`, transcribed from torch to numpy
    (x: [slen, bs], as XLM lays batches out)."""
    assert reset_positions is False or lang1_id != lang2_id
    lengths = len1 + len2
    if not reset_positions:
        lengths -= 1
    slen, bs = lengths.max().item(), lengths.size
    x = np.full((slen, bs), pad_idx)
    x[:len1.max().item()] = x1
    positions = np.tile(np.arange(slen)[:, None], (1, bs))
    langs = np.full((slen, bs), lang1_id)
    for i in range(bs):
        l1 = len1[i] if reset_positions else len1[i] - 1
        x[l1:l1 + len2[i], i] = x2[:len2[i], i]
        if reset_positions:
            positions[l1:, i] -= len1[i]
        langs[l1:, i] = lang2_id
    assert (x == eos_idx).sum() == (4 if reset_positions else 3) * bs
    return x, lengths, positions, langs


def xlm_batch_sentences(sentences, pad_index, eos_index):
    """facebookresearch/XLM, xlm/data/dataset.py, `Dataset.batch_sentences`: `</s> s </s>` columns."""
    lengths = np.array([len(s) + 2 for s in sentences])
    sent = np.full((lengths.max(), len(sentences)), pad_index)
    sent[0] = eos_index
    for i, s in enumerate(sentences):
        sent[1:lengths[i] - 1, i] = s
        sent[lengths[i] - 1, i] = eos_index
    return sent, lengths


def xlm_mask_out(x, rng, word_pred, pred_probs, n_words, mask_index, pad_index):
    """facebookresearch/XLM, xlm/trainer.py, `Trainer.mask_out` (sample_alpha 0, no fp16), transcribed
    with numpy draws in XLM's order: the prediction mask, the random words, the mask/keep/rand choice."""
    slen, bs = x.shape
    pred_mask = rng.random((slen, bs)) <= word_pred
    pred_mask[x == pad_index] = 0
    pred_mask[0] = 0
    _x_real = x[pred_mask]
    _x_rand = rng.integers(n_words, size=len(_x_real))
    _x_mask = np.full(len(_x_real), mask_index)
    probs = rng.choice(3, size=len(_x_real), p=pred_probs)
    _x = _x_mask * (probs == 0) + _x_real * (probs == 1) + _x_rand * (probs == 2)
    x = x.copy()
    x[pred_mask] = _x
    return x, _x_real, pred_mask


def test_tlm_stream_is_xlms_concat_batches():
    from t5lite.data.corruption.translation_lm import concatenate_pair
    english, german = np.array([15, 16, 17, 18]), np.array([25, 26, 27])
    ex = concatenate_pair(english, german, eos_id=1, max_length=64)
    (x1, len1), (x2, len2) = (xlm_batch_sentences([s], 0, 1) for s in (english, german))
    x, _, positions, langs = xlm_concat_batches(x1, len1, 0, x2, len2, 1, 0, 1, reset_positions=True)
    np.testing.assert_array_equal(ex["inputs"], x[:, 0])
    np.testing.assert_array_equal(ex["positions"], positions[:, 0])
    np.testing.assert_array_equal(ex["token_type_ids"], langs[:, 0])
    cut = concatenate_pair(np.arange(3, 100), german, eos_id=1, max_length=16)   # each side gets half
    assert cut["inputs"].tolist() == [1, *range(3, 9), 1, 1, 25, 26, 27, 1]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tlm_masking_is_xlms_mask_out(seed):
    from t5lite.data.corruption.translation_lm import xlm_mask
    tokens = np.array([1, *range(40, 80), 1, 1, *range(90, 120), 1], np.int32)
    inputs, chosen = xlm_mask(tokens, np.random.default_rng(seed), mask_id=5, pool=np.arange(200), word_pred=0.3)
    expected, _, pred_mask = xlm_mask_out(tokens[:, None], np.random.default_rng(seed), 0.3,
                                          np.array([0.8, 0.1, 0.1]), 200, 5, 0)
    np.testing.assert_array_equal(inputs, expected[:, 0])
    np.testing.assert_array_equal(chosen, pred_mask[:, 0])


def test_tlm_evaluation_reads_xlms_reset_positions(clean_gin_state):
    """XLM scores a held-out TLM stream (xlm/evaluation/evaluator.py, `Evaluator.evaluate_mlm`) laid out
    by the same `concat_batches(..., reset_positions=True)` as its training batches (xlm/trainer.py,
    `Trainer.generate_batch`), positions passed to the model: the TLM config's evaluation batches
    (`t5lite eval` and the trainer's validation) carry those positions, as its training rows do."""
    import gin
    from t5lite import cli
    from t5lite.data.converter_registry import get_feature_converter
    from t5lite.data.corruption.translation_lm import tlm_pairs, translation_lm_mask
    from t5lite.data.tasks.pretraining import FEATURES
    from t5lite.infer.evaluation import evaluate
    from t5lite.objectives.encoder import MlmObjective
    pairs = [{"en": "A dog runs across the green field.", "de": "Ein Hund rennt über das grüne Feld."},
             {"en": "Two men play chess.", "de": "Zwei Männer spielen Schach."}]
    task = TaskRegistry.add("tiny_tlm", FunctionSource(lambda split: pairs, splits=("train", "validation")),
                            [tlm_pairs, translation_lm_mask], FEATURES)
    try:
        cli.parse_gin(["configs/local/bert_tiny_tlm_multi30k.gin"], ["CHECKPOINT_PATH = '/tmp/x'"], required_macros=(),
                      entry=("eval", evaluate), base_file="gin/eval.gin")
        lengths = gin.query_parameter("%TASK_FEATURE_LENGTHS")
        training = get_feature_converter(gin.query_parameter("train.feature_converter"))
        train_rows = list(training.convert(task.get_dataset("train", lengths, shuffle=False), lengths))
        batch = MlmObjective().evaluators(task, "validation", lengths)["tiny_tlm"].batches[0]
    finally:
        TaskRegistry.remove("tiny_tlm")
    vocabulary = FEATURES["inputs"].vocabulary
    for i, pair in enumerate(pairs):
        (x1, len1), (x2, len2) = (xlm_batch_sentences([vocabulary.encode(pair[lang])], 0, vocabulary.eos_id)
                                  for lang in ("en", "de"))
        _, length, positions, langs = xlm_concat_batches(x1, len1, 0, x2, len2, 1, 0, vocabulary.eos_id, True)
        n = int(length[0])
        np.testing.assert_array_equal(batch["encoder_positions"][i, :n], positions[:n, 0])
        np.testing.assert_array_equal(train_rows[i]["encoder_positions"][:n], positions[:n, 0])
        np.testing.assert_array_equal(batch["token_type_ids"][i, :n], langs[:n, 0])


@pytest.mark.parametrize("name", ["MlmObjective", "ElectraObjective"])
def test_encoder_objective_refuses_positions_its_evaluation_would_not_read(name):
    from t5lite.objectives import electra, encoder
    objective = {"MlmObjective": encoder.MlmObjective, "ElectraObjective": electra.ElectraObjective}[name]
    own = {"encoder_input_tokens": 8, "encoder_positions": 8}          # the encoder_positions converter, unpacked
    packed = {**own, "encoder_segment_ids": 8}                          # positions that packing numbers
    with pytest.raises(ConfigError, match=f"{name}.converter = 'encoder_positions'"):
        objective().init_features(own)
    with pytest.raises(ConfigError, match="train.feature_converter = 'encoder_positions'"):
        objective(converter="encoder_positions").init_features({"encoder_input_tokens": 8})
    assert set(objective().init_features(packed)) == set(packed)
    assert set(objective(converter="encoder_positions").init_features(own)) == set(own)
    assert objective(converter="encoder_positions").converter == "encoder_positions"   # what evaluation reads


def test_tlm_masks_about_word_pred_of_both_sides():
    from t5lite.data.corruption.translation_lm import tlm_pairs, translation_lm_mask
    from t5lite.data.tasks.pretraining import FEATURES
    pairs = [{"en": "A dog runs across the green field near the river.",
              "de": "Ein Hund rennt über das grüne Feld nahe dem Fluss."}] * 400
    streams = list(translation_lm_mask(tlm_pairs(pairs, {"inputs": 64}, FEATURES), FEATURES, seed=0))
    weights = np.stack([ex["targets_loss_weights"] for ex in streams])
    sides = np.stack([ex["token_type_ids"] for ex in streams])
    n = weights[:, 1:].size
    assert abs(weights[:, 1:].mean() - 0.15) < 4.5 * np.sqrt(0.15 * 0.85 / n)      # XLM's word_pred, binomial
    assert weights[:, 0].sum() == 0 and weights[sides == 1].mean() > 0.1            # the German side too
    assert all((ex["inputs"] == ex["targets"])[ex["targets_loss_weights"] == 0].all() for ex in streams)


def test_cross_lingual_refuses_a_model_without_room_for_fake_english(twin_embedding_model):
    import dataclasses
    from t5lite import models
    from t5lite.analysis import cross_lingual
    small = dataclasses.replace(twin_embedding_model, module=models.build(
        twin_embedding_model.module.config.replace(vocab_size=2176)))
    with pytest.raises(ConfigError, match="embedding has 2176 rows.*fake_english_mlm"):
        cross_lingual.inputs(small, np.array([300, 301]))


def test_cross_lingual_plot_draws_each_run(tmp_path):
    import json
    from t5lite.analysis import cross_lingual
    paths = []
    for name, shared in (("shared", True), ("apart", False)):
        result = {"model": name, "share_special": shared, "share_positions": shared, "chance": 0.001,
                  "layers": [{"english_to_fake": 0.01, "fake_to_english": 0.01}] * 3}
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(result))
    assert cross_lingual.label(json.loads(paths[1].read_text())) == "apart (shared: nothing)"
    out = cross_lingual.plot([str(p) for p in paths], str(tmp_path / "retrieval.png"))
    assert (tmp_path / "retrieval.png").read_bytes()[:4] == b"\x89PNG" and out.endswith("retrieval.png")


# --- Zero-shot transfer in Fake-English: an English-trained classifier read on the same sentences shifted.

def minimult_xnli_evaluation_rows(rows, shift, max_length, special_token_indices, cls_id, shift_special):
    """pdufter/minimult, real/run_xnli.py, `evaluate` for the Fake language (language id 1 of shifts
    [0, shift, 2 shift]), transcribed for unpadded rows: every input id of the evaluation set plus the
    shift (`eval_dataset.tensors[0] += ...`), then per batch, in its order, real/modifications.py's
    `get_language_specific_positions` (the language read off [CLS]: positions + max_length, token type
    1) and `shift_special_tokens` (nothing left to shift) or `unshift_special_tokens` (the shifted
    specials back to the shared ones)."""
    out = []
    for row in rows:
        row = [x + shift for x in row]
        is_fake = row[0] == cls_id + shift                        # get_lang_id
        positions = np.arange(len(row)) + max_length * is_fake
        types = np.zeros(len(row), int) + is_fake
        if not shift_special:
            row = [x - shift if is_fake and x - shift in special_token_indices else x for x in row]
        out.append((row, positions, types))
    return out


@pytest.fixture(scope="module")
def sst2_like_tasks():
    """bert_glue_sst2 and its Fake-English twin's preprocessors over a few in-memory sentences."""
    from t5lite.data.tasks.pretraining import FEATURES
    sentences = ["a gripping , funny film", "dull and far too long", "the cast is superb", "it never comes alive",
                 "one of the year 's best", "a waste of a fine premise"]
    source = FunctionSource(lambda split: [{"sentence": s, "label": i % 2, "idx": i} for i, s in enumerate(sentences)],
                            splits=("validation",))
    fake = TaskRegistry.get("bert_glue_sst2_fake_english")
    english = TaskRegistry.add("tiny_sst2_english", source, TaskRegistry.get("bert_glue_sst2").preprocessors, FEATURES,
                               fake.metric_fns)
    shifted = TaskRegistry.add("tiny_sst2_fake", source, fake.preprocessors, FEATURES, fake.metric_fns)
    yield english, shifted
    for name in ("tiny_sst2_english", "tiny_sst2_fake"):
        TaskRegistry.remove(name)


@pytest.mark.parametrize("share_special", [True, False])
@pytest.mark.parametrize("share_positions", [True, False])
def test_fake_english_sst2_is_minimults_shifted_evaluation(sst2_like_tasks, share_special, share_positions):
    import gin
    from t5lite.data import fake_english
    from t5lite.data.corruption import masking
    english_task, fake_task = sst2_like_tasks
    lengths = {"inputs": 64}
    english = list(english_task.get_dataset("validation", lengths, shuffle=False))
    with gin.unlock_config():
        gin.bind_parameter("fake_english.share_special", share_special)
        gin.bind_parameter("fake_english.share_positions", share_positions)
    try:
        fake = list(fake_task.get_dataset("validation", lengths, shuffle=False))
    finally:
        gin.clear_config()
    vocabulary = english_task.output_features["inputs"].vocabulary
    ids = masking.special_ids(vocabulary)
    specials = {ids["cls"], ids["sep"], ids["mask"], vocabulary.unk_id, vocabulary.pad_id}
    expected = minimult_xnli_evaluation_rows([ex["inputs"].tolist() for ex in english], vocabulary.vocab_size, 64,
                                             specials, ids["cls"], shift_special=not share_special)
    assert [ex["label"] for ex in fake] == [ex["label"] for ex in english]
    for ex, (row, positions, types) in zip(fake, expected):
        assert ex["inputs"].tolist() == row
        if share_positions:     # without minimult's --language_specific_positions: HF's defaults, 0.. and type 0
            positions, types = np.arange(len(row)), np.zeros(len(row))
        np.testing.assert_array_equal(ex["positions"], positions)
        np.testing.assert_array_equal(ex["token_type_ids"], types)
    assert fake_english.FAKE == 1


def test_fake_english_classifier_reads_fake_positions(sst2_like_tasks, twin_embedding_model):
    """With the Fake embeddings copied from the English ones and every anchor shared, the classifier's
    logits on Fake-English are its English logits exactly; Fake-English's own positions (which the
    evaluator must pass on) change them."""
    import gin
    from t5lite.infer.classify import ClassificationEvaluator
    from t5lite.objectives.finetune import ClassificationObjective
    english_task, fake_task = sst2_like_tasks
    config = twin_embedding_model.module.config
    module = ClassificationObjective(num_labels=2).build_model(config)
    features = {k: np.ones((1, 64), np.int32) for k in ("encoder_input_tokens", "token_type_ids")}
    params = module.init(__import__("jax").random.PRNGKey(0), **features)["params"]
    params = {**params, "backbone": twin_embedding_model.variables["params"]}

    def logits(task, without_positions=False):
        evaluator = ClassificationEvaluator(task, "validation", {"inputs": 64}, batch_size=8)
        if without_positions:
            evaluator.batches = [{k: v for k, v in b.items() if k != "encoder_positions"} for b in evaluator.batches]
        return evaluator._outputs(module, params)[0]

    english = logits(english_task)
    np.testing.assert_allclose(logits(fake_task), english, rtol=1e-5, atol=1e-6)
    with gin.unlock_config():
        gin.bind_parameter("fake_english.share_positions", False)
        gin.bind_parameter("fake_english.share_special", True)
    try:
        apart, unplaced = logits(fake_task), logits(fake_task, without_positions=True)
    finally:
        gin.clear_config()
    assert np.abs(apart - unplaced).max() > 1e-4 and np.abs(apart - english).max() > 1e-4


# --- A vocabulary shared by several languages, learnt on sentences sampled as XLM samples them.

@pytest.mark.parametrize("alpha", [0.3, 0.5, 1.0])
def test_vocabulary_sentences_are_sampled_with_xlm_probabilities(alpha):
    from t5lite.data import multilingual_vocab
    sizes, total = [29_000, 29_000, 1_999], 60_000
    counts = multilingual_vocab.sentence_counts(sizes, alpha, total)
    assert counts.sum() == total
    assert np.all(np.abs(counts - total * xlm_set_sampling_probs(sizes, alpha)) < 1)
    corpora = {"en": [f"en {i}" for i in range(50)], "ro": [f"ro {i}" for i in range(5)]}
    sampled = multilingual_vocab.sample_sentences(corpora, alpha, 1000)
    assert [len(lines) for lines in sampled.values()] == multilingual_vocab.sentence_counts([50, 5], alpha, 1000).tolist()
    assert all(line.split()[0] == language for language, lines in sampled.items() for line in lines)
    assert set(sampled["ro"]) == set(corpora["ro"])      # drawn with replacement, as `shuf -r -n`


def _cli(capsys, *args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `t5lite ARGS`, run in this process."""
    from t5lite import cli
    try:
        cli.main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_prepare_learns_one_vocabulary_covering_both_languages(tmp_path, capsys):
    from conftest import shared_data_dir
    from t5lite.data import multilingual_vocab
    from t5lite.data.vocab import SentencePieceVocabulary
    raw = shared_data_dir() / "multi30k" / "task1" / "raw"
    inputs = []
    for language, lines in (("en", 2000), ("de", 500)):
        inputs.append(tmp_path / f"train.{language}")
        inputs[-1].write_text("".join((raw / f"train.{language}").read_text(encoding="utf-8").splitlines(True)[:lines]),
                              encoding="utf-8")
    out = tmp_path / "vocab"
    code, printed, err = _cli(capsys, "prepare", "--vocab_size", "800", "--alpha", "0.5", "--sentences", "3000",
                              "--input", *map(str, inputs), "--output", str(out))
    assert code == 0, err
    expected = np.round(3000 * xlm_set_sampling_probs([2000, 500], 0.5)).astype(int)    # [2000, 1000]
    assert f"en: 2000 sentences (share 0.800), sampled {expected[0]}" in printed
    assert f"de: 500 sentences (share 0.200), sampled {expected[1]}" in printed
    shared = SentencePieceVocabulary(str(out / "spm.model"))
    multilingual_vocab.train([str(inputs[0])], str(tmp_path / "english"), 800, sentences=3000)
    english_only = SentencePieceVocabulary(str(tmp_path / "english" / "spm.model"))
    pieces = {}
    for language, word in (("en", "▁man"), ("de", "▁Mann")):
        test = (raw / f"test_2016_flickr.{language}").read_text(encoding="utf-8").splitlines()[:200]
        ids = [i for line in test for i in shared.encode(line)]
        assert ids.count(shared.unk_id) < 0.005 * len(ids), language          # a rare character at most
        assert word in {shared.id_to_piece(i) for i in set(ids)}, language
        pieces[language] = len(ids), sum(len(english_only.encode(line)) for line in test)
    assert pieces["de"][0] < 0.8 * pieces["de"][1]        # German in far fewer pieces than English's vocabulary gives
    assert pieces["en"][0] < 1.25 * pieces["en"][1]       # English in about as many


def test_prepare_vocabulary_refuses_a_file_without_language(tmp_path, capsys):
    corpus = tmp_path / "captions"
    corpus.write_text("a dog runs\n")
    code, _, err = _cli(capsys, "prepare", "--vocab_size", "100", "--input", str(corpus), "--output",
                        str(tmp_path / "out"))
    assert code == 2 and "name each language's file with its language as suffix" in err
    code, _, err = _cli(capsys, "prepare", "--vocab_size", "100", "--alpha", "0", "--input", str(corpus), "--output",
                        str(tmp_path / "out"))
    assert code == 2 and "--alpha" in err and "> 0" in err


# --- Zero-shot sentence retrieval, against XTREME's code.

def xtreme_mean_pool_embedding(all_layer_outputs, masks):
    """google-research/xtreme, third_party/run_retrieval.py, `mean_pool_embedding`, torch to numpy."""
    return [(embeds * masks[:, :, None]).sum(axis=1) / masks.sum(axis=1)[:, None] for embeds in all_layer_outputs]


def xtreme_similarity_search(x, y):
    """google-research/xtreme, third_party/run_retrieval.py, `similarity_search` with normalize=True and
    faiss's exact IndexFlatL2 written out: for each row of y, the nearest normalised row of x."""
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    y = y / np.linalg.norm(y, axis=1, keepdims=True)
    return np.argmin(((y[:, None, :] - x[None, :, :]) ** 2).sum(-1), axis=1)


ENGLISH = ["A dog runs across the grass.", "Two men play football in the park.", "A woman is cooking dinner.",
           "Children are swimming in a lake.", "A man rides a red bicycle.", "An old man reads a newspaper."]
GERMAN = ["Ein Hund rennt über das Gras.", "Zwei Männer spielen Fußball im Park.", "Eine Frau kocht das Abendessen.",
          "Kinder schwimmen in einem See.", "Ein Mann fährt ein rotes Fahrrad.", "Ein alter Mann liest eine Zeitung."]


@pytest.mark.parametrize("tlm", [False, True])
def test_sentence_retrieval_is_xtremes(twin_embedding_model, tlm):
    from t5lite.analysis import forward, sentence_retrieval
    subject = twin_embedding_model
    result = sentence_retrieval.retrieval(subject, ENGLISH, GERMAN, ("en", "de"), tlm=tlm)
    pooled = []
    for language, texts in enumerate((ENGLISH, GERMAN)):
        rows = sentence_retrieval.rows(subject, texts, language, tlm)
        states = forward.encoder_states(subject, rows["tokens"], rows["positions"], rows["token_types"])
        pooled.append(xtreme_mean_pool_embedding(states, (rows["tokens"] != 0).astype(np.float32)))
    for layer, (english, german) in enumerate(zip(*pooled)):
        expected = np.mean(xtreme_similarity_search(english, german) == np.arange(len(GERMAN)))
        assert result["layers"][layer]["de_to_en"] == pytest.approx(expected)
        assert result["layers"][layer]["en_to_de"] == pytest.approx(
            np.mean(xtreme_similarity_search(german, english) == np.arange(len(ENGLISH))))
    assert result["chance"] == 1 / 6 and len(result["layers"]) == 3
    same = sentence_retrieval.retrieval(subject, ENGLISH, ENGLISH)
    assert [layer["de_to_en"] for layer in same["layers"]] == [1.0] * 3


def test_sentence_retrieval_reads_sentences_as_training_did(twin_embedding_model):
    from t5lite.analysis import sentence_retrieval
    from t5lite.data.corruption.masking import special_ids
    subject = twin_embedding_model
    ids = list(subject.vocabulary.encode(GERMAN[0]))
    tlm = sentence_retrieval.rows(subject, GERMAN[:1], language=1, tlm=True)
    xlm, _ = xlm_batch_sentences([ids], 0, subject.vocabulary.eos_id)
    np.testing.assert_array_equal(tlm["tokens"][0, :len(ids) + 2], xlm[:, 0])
    assert tlm["token_types"][0, 0] == 1 and tlm["tokens"].shape[1] == 128
    mlm = sentence_retrieval.rows(subject, GERMAN[:1])
    specials = special_ids(subject.vocabulary)
    assert mlm["tokens"][0, :len(ids) + 2].tolist() == [specials["cls"], *ids, specials["sep"]]
    assert mlm["token_types"].max() == 0


def test_sentence_retrieval_refuses_unaligned_files(tmp_path, capsys):
    first, second = tmp_path / "test.en", tmp_path / "test.de"
    first.write_text("a\nb\n")
    second.write_text("a\n")
    code, _, err = _cli(capsys, "probe", "--model", str(tmp_path / "none"), "--parallel", str(first), str(second),
                        "--out", str(tmp_path / "out"))
    assert code == 2 and "has 2 lines and" in err and "same length" in err


def test_sentence_retrieval_plot_draws_each_run(tmp_path):
    import json
    from t5lite.analysis import sentence_retrieval
    paths = []
    for name in ("mlm", "tlm"):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps({"model": name, "languages": ["en", "de"], "chance": 0.001,
                                         "layers": [{"de_to_en": 0.1, "en_to_de": 0.1}] * 3}))
    out = sentence_retrieval.plot([str(p) for p in paths], str(tmp_path / "retrieval.png"))
    assert (tmp_path / "retrieval.png").read_bytes()[:4] == b"\x89PNG" and out.endswith("retrieval.png")
