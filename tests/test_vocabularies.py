"""The vocabulary kinds against independent references: bytes vs seqio's ByteVocabulary, byte-level
BPE vs Hugging Face's GPT-2 / RoBERTa tokenizers on the same files; offsets, special ids, gin
selection and the refusal of a vocabulary a run was not trained with."""
import json
import unicodedata

import gin
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from t5lite.data import byte_bpe, corpus, vocab
from t5lite.data.byte_vocab import ByteVocabulary
from t5lite.data.corruption import masking
from t5lite.errors import CheckpointError, ConfigError

TEXTS = ["Return the value of the attribute.", "naïve café façade", "Καλημέρα κόσμε", "你好世界，今天天气很好",
         "emoji 🎉👍 and ✓ marks", "  leading and   inner  spaces ", "tabs\tand\nnewlines", "", "a",
         "don't can't it's 1,234.56 $5 e-mail", "Привет, мир"]


@pytest.fixture(scope="module")
def kinds():
    return {kind: vocab.make_vocabulary(kind) for kind in ("sentencepiece", "byte_bpe", "bytes")}


# --- bytes: seqio's ByteVocabulary is the reference.

def test_bytes_match_seqio():
    seqio = pytest.importorskip("seqio", reason="seqio is the ByteVocabulary reference (extras 'reference')")
    theirs, ours = seqio.ByteVocabulary(extra_ids=125), ByteVocabulary()
    assert (ours.vocab_size, ours.pad_id, ours.eos_id, ours.unk_id) == (theirs.vocab_size, 0, theirs.eos_id,
                                                                       theirs.unk_id)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs.encode(text)
        assert ours.decode(ids) == theirs.decode(ids) == text
        noisy = [ours.sentinel_id(0)] + ids + [ours.vocab_size + 5, 2, 0] + ids[:1] + [1] + ids
        assert ours.decode(noisy) == theirs.decode(noisy)
    assert ours.sentinel_id(0) == 383 and ours.sentinel_id(124) == 259


# --- byte-level BPE: Hugging Face's fast tokenizers on the same files are the reference.

@pytest.mark.parametrize("hf_class", ["GPT2TokenizerFast", "RobertaTokenizerFast"])
def test_byte_bpe_matches_hugging_face(bpe_files, hf_class):
    transformers = pytest.importorskip("transformers", reason="Hugging Face tokenizers are the reference (extras 'hf')")
    theirs = getattr(transformers, hf_class).from_pretrained(str(bpe_files))
    ours = byte_bpe.ByteBPEVocabulary(str(bpe_files))
    texts = TEXTS + list(corpus.embedded_documents()[200:260])
    for text in texts:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == theirs.decode(ids) == text
    assert ours.vocab_size == theirs.vocab_size and ours.extra_ids == 0


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=60).filter(lambda t: "<" not in t))
def test_byte_bpe_matches_gpt2_on_any_text(bpe_files, text):
    transformers = pytest.importorskip("transformers", reason="Hugging Face tokenizers are the reference (extras 'hf')")
    theirs = transformers.GPT2TokenizerFast.from_pretrained(str(bpe_files))
    ours = byte_bpe.ByteBPEVocabulary(str(bpe_files))
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)
    assert ours.decode(ours.encode(text)) == text


def test_tiny_byte_bpe_layout(kinds):
    v = kinds["byte_bpe"]
    assert [v.id_to_piece(i) for i in range(5)] == ["<pad>", "</s>", "<unk>", "<s>", "<mask>"]
    assert (v.pad_id, v.eos_id, v.unk_id, v.bos_id, v.mask_id) == (0, 1, 2, 3, 4)
    assert v.vocab_size == 2100 and v.id_to_piece(v.sentinel_id(0)) == "<extra_id_0>"
    ids = v.encode("keep <extra_id_0> here")
    assert v.sentinel_id(0) in ids and v.decode(ids) == "keep <extra_id_0> here"


def test_gpt2_style_files_use_endoftext(tmp_path):
    """GPT-2's only special token stands for EOS, BOS, UNK and pad (as Hugging Face users pad)."""
    vocabulary = {piece: i for i, piece in enumerate(["a", "b", "c", "Ġ", "ab", "<|endoftext|>"])}
    (tmp_path / "vocab.json").write_text(json.dumps(vocabulary))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    v = byte_bpe.ByteBPEVocabulary(str(tmp_path))
    assert (v.eos_id, v.bos_id, v.unk_id, v.pad_id, v.mask_id, v.vocab_size) == (5, 5, 5, 5, None, 6)
    assert v.encode("ab c") == [4, 3, 2] and v.decode([4, 3, 2, 5, 0]) == "ab c"
    with pytest.raises(ValueError, match="no mask/CLS token and fewer than 1 sentinels"):
        masking.special_ids(v)
    with pytest.raises(ConfigError, match="pads with id 5 and has 'a' at id 0"):
        vocab.check_trainable(v)


# --- every kind: the interface, offsets and special ids.

@pytest.mark.parametrize("kind", ["sentencepiece", "byte_bpe", "bytes"])
def test_interface(kinds, kind):
    v = kinds[kind]
    for text in TEXTS[:6]:
        ids = v.encode(text)
        assert v.decode(ids + [v.eos_id] + ids) == v.decode([v.pad_id] + ids + [v.pad_id])
        lossless = text if kind != "sentencepiece" else " ".join(unicodedata.normalize("NFKC", text).split())
        assert v.decode(ids) == lossless   # SentencePiece normalises (NFKC, whitespace), as T5's does
        assert v.encode_with_offsets(text)[0] == ids
    assert v.decode([v.vocab_size + 3]) == v.decode([v.unk_id])
    assert v.sentinel_id(0) == v.vocab_size - 1
    with pytest.raises(ValueError, match="out of range"):
        v.sentinel_id(v.extra_ids)


MIXED = st.text(alphabet=st.sampled_from(list("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 .,;:!?'-éüößçñ你好世界κόσμеПр🎉")),
                max_size=50)


@settings(max_examples=80, deadline=None)
@given(text=MIXED, kind=st.sampled_from(["sentencepiece", "byte_bpe", "bytes"]))
def test_offsets_map_back_to_the_text(kinds, text, kind):
    """Each span lies in the text and spans never go back; a piece that decodes to whole characters
    reads exactly its span; together the spans cover every non-space character."""
    v = kinds[kind]
    ids, spans = v.encode_with_offsets(text)
    assert len(ids) == len(spans)
    starts = [s for s, _ in spans]
    assert starts == sorted(starts) and all(0 <= s <= e <= len(text) for s, e in spans)
    for token, (s, e) in zip(ids, spans):
        piece_text = v.decode([token]).strip()
        if piece_text and "\ufffd" not in piece_text:   # not a piece of a character's bytes
            assert text[s:e] == piece_text
    covered = {i for s, e in spans for i in range(s, e)}
    assert covered == {i for i, c in enumerate(text) if not c.isspace()}


def test_special_ids_for_every_kind(kinds):
    sp, bpe, byte = kinds["sentencepiece"], kinds["byte_bpe"], kinds["bytes"]
    assert masking.special_ids(sp) == {"mask": sp.vocab_size - 1, "cls": sp.vocab_size - 2, "sep": 1}
    assert masking.special_ids(bpe) == {"mask": 4, "cls": 3, "sep": 1}   # RoBERTa's <mask>, <s>, </s>
    assert masking.special_ids(byte) == {"mask": 383, "cls": 382, "sep": 1}
    assert masking.word_starts(np.array(bpe.encode(" the value")), bpe).tolist() == [True, True]   # "Ġ"


# --- selection in gin.

def test_gin_selects_the_kind_the_tasks_use():
    from t5lite.data import get_task
    task_vocab = get_task("embedded_docs_span_corruption").output_features["inputs"].vocabulary
    try:
        gin.parse_config("vocabulary.kind = 'bytes'")
        assert task_vocab.vocab_size == 384 and vocab.kind_of(task_vocab) == "bytes"
        assert len(masking._regular_ids(task_vocab)) == 384 - 125 - 3   # caches follow the setting
        gin.parse_config("vocabulary.kind = 'byte_bpe'")
        assert vocab.kind_of(task_vocab) == "byte_bpe" and task_vocab.mask_id == 4
    finally:
        gin.clear_config()
    assert vocab.kind_of(task_vocab) == "sentencepiece" and task_vocab.vocab_size == 2100
    with pytest.raises(ConfigError, match="expected one of"):
        vocab.make_vocabulary("unigram")
    with pytest.raises(FileNotFoundError, match="vocabulary.path"):
        vocab.make_vocabulary("byte_bpe", "/nonexistent/tokenizer.json")


def test_default_vocabulary_reads_gin_once_per_configuration_and_follows_every_change(monkeypatch, tmp_path):
    """DEFAULT_VOCABULARY is in the tokenisation hot path: gin is asked again only after its
    `vocabulary` bindings changed, yet a macro, a scope, `set_default_vocabulary` and
    `gin.clear_config` are all followed."""
    calls = []
    real = vocab.vocabulary_settings
    monkeypatch.setattr(vocab, "vocabulary_settings", lambda: calls.append(1) or real())
    default = vocab.DEFAULT_VOCABULARY
    kind = lambda: vocab.kind_of(default)
    try:
        gin.clear_config()
        assert kind() == "sentencepiece"
        calls.clear()
        for _ in range(5):
            default.eos_id, default.encode("a few words")
        assert calls == []                                          # unchanged gin: not asked again
        gin.parse_config("vocabulary.kind = 'bytes'")
        assert kind() == "bytes" and default.vocab_size == 384 and len(calls) == 1
        gin.parse_config("KIND = 'byte_bpe'\nvocabulary.kind = %KIND")
        assert kind() == "byte_bpe"
        gin.parse_config("KIND = 'bytes'")                          # only the macro changes
        assert kind() == "bytes"
        gin.bind_parameter("vocabulary.kind", "sentencepiece")
        assert kind() == "sentencepiece"
        gin.parse_config("narrow/vocabulary.kind = 'bytes'")        # a scope: the active one decides
        with gin.config_scope("narrow"):
            assert kind() == "bytes"
        assert kind() == "sentencepiece"
        spm_path = default.model_path
        vocab.set_default_vocabulary(spm_path, extra_ids=10)        # wins over gin
        assert default.vocab_size == 2010
        vocab.set_default_vocabulary(None)
        assert default.vocab_size == 2100
        gin.clear_config()
        gin.parse_config("vocabulary.kind = 'bytes'")
        assert kind() == "bytes"
    finally:
        vocab.set_default_vocabulary(None)
        gin.clear_config()
    assert kind() == "sentencepiece" and default.vocab_size == 2100


# --- identity: a run refuses a vocabulary it was not trained with.

def test_identity_mismatch_is_refused_naming_both(tmp_path, kinds):
    sp, byte = kinds["sentencepiece"], kinds["bytes"]
    vocab.record_identity(str(tmp_path), sp)
    vocab.check_identity(str(tmp_path), sp)                  # the same one passes
    vocab.check_identity(str(tmp_path), vocab.make_vocabulary("sentencepiece", sp.model_path))  # equal content
    with pytest.raises(CheckpointError, match=r"SentencePieceVocabulary.*ByteVocabulary.*allow_mismatch") as e:
        vocab.check_identity(str(tmp_path), byte)
    assert "differ in kind, vocab_size" in str(e.value)
    vocab.check_identity(str(tmp_path), byte, allow_mismatch=True)
    with pytest.raises(CheckpointError):   # same size and kind, other pieces
        vocab.check_identity(str(tmp_path), vocab.make_vocabulary("sentencepiece", sp.model_path, extra_ids=99))
    with pytest.raises(ConfigError, match="has 2100 ids but the model's embedding has 1000 rows"):
        vocab.check_identity(None, sp, model_vocab_size=1000)


def test_train_and_load_refuse_another_vocabulary(tmp_path, micro_config):
    from conftest import train_tiny
    from t5lite.infer import predict
    run = tmp_path / "run"
    train_tiny(run, micro_config, 2)
    assert json.loads((run / "vocabulary.json").read_text())["kind"] == "sentencepiece"
    try:
        gin.parse_config("vocabulary.kind = 'bytes'")
        with pytest.raises(CheckpointError, match="trained with the vocabulary SentencePieceVocabulary"):
            train_tiny(run, micro_config, 3)                                     # resuming
        with pytest.raises(CheckpointError, match="ByteVocabulary"):
            train_tiny(tmp_path / "ft", micro_config, 1, initial_checkpoint_path=str(run))   # fine-tuning
        with pytest.raises(CheckpointError, match="allow_mismatch"):
            predict.load_params(micro_config, str(run))                      # infer and eval
        gin.parse_config("vocabulary.allow_mismatch = True")
        predict.load_params(micro_config, str(run))
    finally:
        gin.clear_config()
    predict.load_params(micro_config, str(run))
