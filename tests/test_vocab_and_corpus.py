"""The embedded corpus and the SentencePiece vocabulary trained on it (T5's id conventions)."""
import numpy as np
import pytest

from t5lite.data import corpus, vocab


@pytest.fixture(scope="module")
def default_vocab():
    return vocab.DEFAULT_VOCABULARY._resolve()


def test_corpus_is_prose_documents():
    docs = corpus.embedded_documents()
    assert len(docs) > 300 and sum(map(len, docs)) > 1_000_000
    assert all(doc.strip() == doc and doc for doc in docs)
    sample = " ".join(docs[:50])
    assert ">>>" not in sample and "    " not in sample


@pytest.mark.parametrize("text,kept", [
    ("Return the number of items in a container.", True),
    ("x = foo(bar)", False),
    (">>> print(x) is how you show a value.", False),
    ("    indented code line that is long enough.", False),
    ("| a | b | c | d | e |", False),
])
def test_prose_filter(text, kept):
    assert corpus.is_prose(text) is kept


def test_special_ids_and_sentinels(default_vocab):
    v = default_vocab
    assert (v.pad_id, v.eos_id, v.unk_id) == (0, 1, 2)
    assert v.vocab_size == v.base_vocab_size + 100 == 2100
    assert v.sentinel_id(0) == v.vocab_size - 1 and v.sentinel_id(99) == v.base_vocab_size
    with pytest.raises(ValueError, match="out of range"):
        v.sentinel_id(100)
    assert vocab.padded_vocab_size(v.vocab_size) == 2176 and vocab.padded_vocab_size(32100) == 32128


def test_encode_decode_round_trip_with_sentinels(default_vocab):
    v = default_vocab
    text = "Return the value <extra_id_0> of the attribute <extra_id_1>."
    ids = v.encode(text)
    assert v.sentinel_id(0) in ids and v.sentinel_id(1) in ids
    assert ids.index(v.sentinel_id(0)) < ids.index(v.sentinel_id(1))
    assert v.decode(ids) == text
    assert v.sentinel_id(0) not in v.encode("jel<extra_id_0>ly")  # only word-initial, as in seqio
    assert v.decode(ids + [1, 55, 66]) == text  # stops at EOS
    assert v.decode([0] + ids + [0]) == text    # drops padding


@pytest.mark.parametrize("text", ["Καλημέρα κόσμε, τι κάνεις;", "你好世界，今天天气很好", "日本語のテキスト",
                                  "emoji 🎉👍 and ✓ marks", "Привет, мир", "naïve café façade"])
def test_any_script_round_trips_through_byte_fallback(default_vocab, text):
    import unicodedata
    ids = default_vocab.encode(text)
    assert default_vocab.unk_id not in ids
    assert default_vocab.decode(ids) == unicodedata.normalize("NFKC", text)  # T5's spiece normalises NFKC too


def test_byte_fallback_needs_room_for_the_bytes(tmp_path):
    with pytest.raises(ValueError, match="vocab_size=100 cannot hold the 256 byte pieces"):
        vocab.train_sentencepiece(["some text"], 100, out_dir=str(tmp_path), byte_fallback=True)


def test_out_of_range_ids_decode_as_unk(default_vocab):
    v = default_vocab
    assert v.decode([v.vocab_size, v.vocab_size + 7]) == v.decode([v.unk_id, v.unk_id])


def test_training_is_cached_and_deterministic(tmp_path):
    texts = [f"Sentence number {i} says something about the object and its value." for i in range(300)]
    a = vocab.train_sentencepiece(texts, 50, out_dir=str(tmp_path))
    b = vocab.train_sentencepiece(texts, 50, out_dir=str(tmp_path))
    assert a == b
    v = vocab.SentencePieceVocabulary(a, extra_ids=10)
    assert v.vocab_size == 60 and v.decode(v.encode("the object")) == "the object"


def test_a_vocabulary_without_t5_ids_is_rejected(tmp_path):
    import sentencepiece as spm
    prefix = str(tmp_path / "bad")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["hello world the cat sat on the mat"] * 50),
                                   model_prefix=prefix, vocab_size=20, minloglevel=2)
    with pytest.raises(ValueError, match="pad/eos/unk ids 0/1/2"):
        vocab.SentencePieceVocabulary(prefix + ".model")


def test_set_default_vocabulary_points_tasks_at_another_model(tmp_path, default_vocab):
    from t5lite.data import get_task
    path = vocab.train_sentencepiece(list(corpus.embedded_documents()[:40]), 150, out_dir=str(tmp_path))
    try:
        vocab.set_default_vocabulary(path)
        task_vocab = get_task("embedded_docs_span_corruption").output_features["inputs"].vocabulary
        assert task_vocab.vocab_size == 250
    finally:
        vocab.set_default_vocabulary(None)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        vocab.set_default_vocabulary(str(tmp_path / "missing.model"))


def test_pretraining_task_gives_span_corrupted_examples(default_vocab):
    from t5lite.data import get_task
    task = get_task("embedded_docs_span_corruption")
    examples = list(zip(range(5), task.get_dataset("train", {"inputs": 512, "targets": 114}, shuffle=True, seed=3)))
    for _, ex in examples:
        assert ex["inputs"].shape == (512,) and ex["targets"].shape == (114,)
        assert ex["inputs"][-1] == 1 and ex["targets"][-1] == 1
        assert ex["targets"][0] == default_vocab.sentinel_id(0)
    again = next(task.get_dataset("train", {"inputs": 512, "targets": 114}, shuffle=True, seed=3))
    np.testing.assert_array_equal(again["inputs"], examples[0][1]["inputs"])
