"""t5lite's data side against the real upstream packages (seqio, t5), run on the same inputs.

The upstream packages are the `reference` extra (CI installs it); importing TensorFlow takes
seconds, so the reference checks share one module and module-level fixtures.
"""
import numpy as np
import pytest

from t5lite.data import vocab

seqio = pytest.importorskip("seqio", reason="the seqio reference needs the `reference` extra")

SENTINEL_TEXTS = [
    "<extra_id_0>",
    "Return the value<extra_id_0> of the attribute<extra_id_1>.",
    "Return the value <extra_id_0> of the attribute <extra_id_1> .",
    "<extra_id_0> starts the text and <extra_id_99> is the last one",
    "I like peanut butter and jel<extra_id_0>ly sandwiches.",
    "I like peanut butter and <extra_id_0>ly sandwiches.",
    "two in a row<extra_id_3><extra_id_4> then text",
    "spaces  <extra_id_2>   around\tit",
    "a (<extra_id_5>) in brackets, \"<extra_id_6>\" in quotes",
    "not a sentinel: <extra_id_100> or <extra_id_x> or extra_id_0",
    "Καλημέρα <extra_id_0> κόσμε",
    "x<extra_id_0>y<extra_id_1>z",
]


@pytest.fixture(scope="module")
def vocabularies():
    ours = vocab.DEFAULT_VOCABULARY._resolve()
    return ours, seqio.SentencePieceVocabulary(ours.model_path, extra_ids=100)


@pytest.mark.parametrize("text", SENTINEL_TEXTS)
def test_sentinels_encode_and_decode_as_seqio(vocabularies, text):
    ours, theirs = vocabularies
    ids = ours.encode(text)
    assert ids == list(theirs.encode(text))
    assert ours.decode(ids) == theirs.decode(ids)


def test_sizes_sentinels_and_out_of_range_ids_as_seqio(vocabularies):
    ours, theirs = vocabularies
    assert ours.vocab_size == theirs.vocab_size
    assert ours.sentinel_id(0) == theirs.encode("<extra_id_0>")[-1]
    rng = np.random.default_rng(0)
    for _ in range(20):
        ids = [int(i) for i in rng.integers(3, ours.vocab_size + 50, size=12)]
        assert ours.decode(ids) == theirs.decode(ids)


# ----------------------------------------------------------------------------- t5's own functions

@pytest.fixture(scope="module")
def t5_metrics():
    pytest.importorskip("t5", reason="the t5 reference needs the `reference` extra")
    from t5.evaluation import metrics as t5_metrics
    return t5_metrics


def _lead3(article: str) -> str:
    import re
    return " ".join(re.split(r"(?<=[.!?])\s+", article.strip())[:3])


def test_rouge_on_cnn_dailymail_lead3_as_t5(t5_metrics):
    import csv
    from conftest import shared_data_dir
    from t5lite import metrics
    path = shared_data_dir() / "summarization" / "cnn_dailymail" / "cnn_dailymail_validation_subset.csv"
    with open(path, encoding="utf-8", newline="") as f:
        rows = [row for _, row in zip(range(300), csv.DictReader(f))]
    targets, predictions = [r["highlights"] for r in rows], [_lead3(r["article"]) for r in rows]
    np.random.seed(0)
    ours = metrics.rouge(targets, predictions)
    np.random.seed(0)
    theirs = t5_metrics.rouge(targets, predictions)
    assert ours.keys() == theirs.keys()
    for key in theirs:
        assert ours[key] == pytest.approx(theirs[key], abs=1e-9), key
    np.random.seed(0)
    assert metrics.rouge(targets, predictions, use_stemmer=True)["rouge1"] > ours["rouge1"] + 0.5


@pytest.fixture(scope="module")
def t5_preprocessors():
    pytest.importorskip("t5", reason="the t5 reference needs the `reference` extra")
    import tensorflow as tf
    from t5.data import preprocessors as t5_preprocessors
    return tf, t5_preprocessors


def _run_tf(tf, rows, fn):
    """Rows (dicts of str / lists of str) through a t5 dataset preprocessor, back as Python."""
    spec = {k: tf.TensorSpec([None] if isinstance(v, list) else [], tf.string) for k, v in rows[0].items()}
    spec = {k: ({"text": tf.TensorSpec([None], tf.string)} if k == "answers" else s) for k, s in spec.items()}
    dataset = fn(tf.data.Dataset.from_generator(lambda: iter(rows), output_signature=spec))
    decode = lambda v: [x.decode() for x in v] if isinstance(v, np.ndarray) else v.decode()
    return [{k: decode(v) for k, v in ex.items()} for ex in dataset.as_numpy_iterator()]


def test_squad_formatting_as_t5(t5_preprocessors):
    from conftest import shared_data_dir
    from t5lite.data import get_task
    from t5lite.data.tasks.squad import squad
    tf, t5p = t5_preprocessors
    raw = list(get_task("squad_v1").source.load("validation", data_dir=str(shared_data_dir() / "squad" / "v1.1")))
    sample = raw[::25]  # ~420 questions over every article
    rows = [{"id": r["id"], "question": r["question"], "context": r["context"],
             "answers": {"text": list(r["answers"]["text"])}} for r in sample]
    theirs = _run_tf(tf, rows, t5p.squad)
    ours = list(squad(sample))
    assert len(ours) == len(theirs) == len(sample)
    for a, b in zip(ours, theirs):
        for key in ("inputs", "targets", "question", "context", "answers", "id"):
            assert a[key] == b[key], (key, a["id"])
    # The paper-era rule differs wherever a non-ASCII character occurs.
    assert any(a["inputs"] != b["inputs"] for a, b in zip(squad(sample, punctuation="non_word"), theirs))


DPR_ROWS = [
    {"sentence": "Bob asked Tom if he can lend some money.", "pronoun": "he", "candidates": ["Bob", "Tom"], "label": 1},
    {"sentence": "The cat chased the mouse because it was hungry.", "pronoun": "it", "candidates": ["the cat", "the mouse"],
     "label": 0},
    {"sentence": "The fish ate the worm. It was tasty.", "pronoun": "It", "candidates": ["The fish", "The worm"],
     "label": 1},
    {"sentence": "Anna told Mary that she, of all people, would win.", "pronoun": "she", "candidates": ["Anna", "Mary"],
     "label": 0},
    {"sentence": "The trophy did not fit in the suitcase because it was too big it.", "pronoun": "it",
     "candidates": ["the trophy", "the suitcase"], "label": 0},
    {"sentence": "Sam thanked John because he had helped him.", "pronoun": "him", "candidates": ["Sam", "John"],
     "label": 1},
    {"sentence": "The dog bit the man, so they shot it", "pronoun": "it", "candidates": ["the dog", "the man"],
     "label": 0},
]


def test_dpr_format_as_t5(t5_preprocessors):
    from t5lite.data.tasks.superglue import dpr_simple
    tf, t5p = t5_preprocessors
    spec = {"sentence": tf.TensorSpec([], tf.string), "pronoun": tf.TensorSpec([], tf.string),
            "candidates": tf.TensorSpec([2], tf.string), "label": tf.TensorSpec([], tf.int64)}
    dataset = tf.data.Dataset.from_generator(lambda: iter(DPR_ROWS), output_signature=spec)
    theirs = [{k: v.decode() for k, v in ex.items()}
              for ex in t5p.definite_pronoun_resolution_simple(dataset).as_numpy_iterator()]
    assert [{"inputs": e["inputs"], "targets": e["targets"]} for e in dpr_simple(DPR_ROWS)] == theirs


def test_mixture_rates_as_t5(t5_preprocessors):
    from t5.data import glue_utils
    from t5lite.data import get_mixture
    # t5 names -> t5lite names: drop the version, WSC's simple variants are super_glue_wsc(_train).
    rename = {"super_glue_wsc_v102_simple_train": "super_glue_wsc_train",
              "super_glue_wsc_v102_simple_eval": "super_glue_wsc"}
    for ours_name, theirs in [("glue_v002_proportional", glue_utils.get_glue_weight_mapping()),
                              ("super_glue_v102_proportional", glue_utils.get_super_glue_weight_mapping())]:
        expected = {rename.get(k, k.replace("_v002", "").replace("_v102", "")): v for k, v in theirs.items()}
        mixture = get_mixture(ours_name)
        assert dict(zip((t.name for t in mixture.tasks), mixture.rates("train"))) == expected


class _Frame(dict):
    """The one DataFrame feature compute_avg_glue uses: columns, indexed by name."""
    @property
    def columns(self):
        return list(self)


def test_glue_and_super_glue_averages_as_t5(t5_preprocessors):
    pytest.importorskip("pandas", reason="t5.evaluation.eval_utils imports pandas (the `reference` extra)")
    from t5.evaluation import eval_utils
    from t5lite.infer.evaluation import BENCHMARK_GROUPS, benchmark_averages
    # t5lite task -> t5's TensorBoard task name (METRIC_NAMES' keys are "<t5 task>/<metric>").
    t5_task = {"super_glue_wsc": "super_glue_wsc_v102_simple_eval"}
    rng = np.random.default_rng(0)
    ours = {}
    for groups in BENCHMARK_GROUPS.values():
        for members in groups.values():
            for task, key in members:
                ours.setdefault(task, {})[key] = float(rng.uniform(0, 100))
    ours["glue_wnli"] = {"accuracy": 3.0}  # left out, as in T5
    frame = _Frame()
    for task, values in ours.items():
        version = "_v102" if task.startswith("super_glue") else "_v002"
        for key, value in values.items():
            tag = f"{t5_task.get(task, task + version)}/{key}"
            if tag in eval_utils.METRIC_NAMES:
                frame[eval_utils.METRIC_NAMES[tag].name] = [value]
    theirs = eval_utils.compute_avg_glue(frame)
    got = benchmark_averages(ours)
    assert got["glue_average"] == pytest.approx(theirs["Average GLUE Score"][0], abs=1e-9)
    assert got["super_glue_average"] == pytest.approx(theirs["Average SuperGLUE Score"][0], abs=1e-9)
    del ours["glue_mnli_mismatched"]
    assert set(benchmark_averages(ours)) == {"super_glue_average"}  # only complete benchmarks are averaged


def test_span_corruption_stream_as_t5(t5_preprocessors):
    """TF's RNG differs from numpy's, so compare what does not depend on it: how many examples, their
    lengths (the short last piece of every 128 documents included) and sentinel structure."""
    import collections
    from conftest import t5_and_our_features, tf_targets_dataset
    from t5lite.data import preprocessors as P
    tf, t5p = t5_preprocessors
    t5_features, features = t5_and_our_features(seqio)
    ours_vocab = features["targets"].vocabulary
    rng = np.random.default_rng(0)
    docs = [rng.integers(3, 2000, size=int(n)).astype(np.int32) for n in rng.integers(0, 1500, size=300)]
    sequence_length = {"inputs": 512, "targets": 114}
    with seqio.utils.map_seed_manager(42):
        theirs = list(t5p.span_corruption(tf_targets_dataset(tf, docs), sequence_length, t5_features).as_numpy_iterator())
    ours = list(P.span_corruption(iter({"targets": d} for d in docs), sequence_length, features, seed=42))
    # t5 appends EOS afterwards (append_eos_after_trim); t5lite's examples already end in it.
    lengths = lambda examples, eos: collections.Counter((len(e["inputs"]) + eos, len(e["targets"]) + eos)
                                                        for e in examples)
    assert lengths(ours, 0) == lengths(theirs, 1)
    assert lengths(ours, 0)[(512, 114)] == len(ours) - 3  # 300 documents: three short last pieces
    is_sentinel = lambda ids: ids >= ours_vocab.base_vocab_size
    for a, b in zip(ours, theirs):
        assert is_sentinel(a["inputs"][:-1]).sum() == is_sentinel(b["inputs"]).sum()
        assert a["targets"][0] == b["targets"][0] == ours_vocab.sentinel_id(0)
    with pytest.raises(ValueError, match="114"):
        t5p.span_corruption(tf_targets_dataset(tf, docs), {"inputs": 512, "targets": 100}, {"inputs": None, "targets": None})
    with pytest.raises(ValueError, match="114"):
        next(P.span_corruption(iter([]), {"inputs": 512, "targets": 100}, features, seed=0))
