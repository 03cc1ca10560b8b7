"""Every file format t5lite reads is checked against what it claims: a file that breaks its format
is refused in one line naming the file (and line), exit code 2, writing nothing; an IOB2 tagging
file that breaks the scheme is read with one warning naming the file and line."""
from __future__ import annotations

import json
import logging

import gin
import pytest

from conftest import shared_data_dir
from t5lite import cli
from t5lite.analysis import words
from t5lite.errors import CheckpointError, DataError
from t5lite.infer import peft_checkpoint

DATA = shared_data_dir()
ELMO = DATA / "elmo"


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def refused(argv: list[str], capsys, monkeypatch) -> str:
    """The one line `t5lite argv` prints on stderr (besides the training progress bar) as it exits with code 2."""
    monkeypatch.delenv("T5LITE_DEBUG", raising=False)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line and not line.startswith("train:")]
    assert exited.value.code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("t5lite: error: "), lines
    return lines[0]


# --- ELMo's options.json against its weights


def _options(tmp_path, change) -> str:
    options = json.loads((ELMO / "options.json").read_text())
    change(options)
    path = tmp_path / "options.json"
    path.write_text(json.dumps(options))
    return str(path)


def _set(section: str, field: str, value):
    return lambda options: options[section].__setitem__(field, value)


@pytest.mark.parametrize("make_options, names", [
    (lambda tmp: _options(tmp, _set("lstm", "dim", 32)), "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0 does not match"),
    (lambda tmp: _options(tmp, _set("lstm", "projection_dim", 8)), "CNN_proj/W_proj does not match"),
    (lambda tmp: _options(tmp, _set("char_cnn", "activation", "gelu")), "char_cnn.activation 'gelu' is not one"),
    (lambda tmp: _options(tmp, lambda o: o.pop("char_cnn")), "is not a bilm options file: KeyError: 'char_cnn'"),
    (lambda tmp: (tmp / "o.json").write_text('{"lstm": {\n  "dim": ,') and str(tmp / "o.json"),
     "o.json: line 2: not valid JSON"),
    (lambda tmp: str(ELMO / "lm_weights.hdf5"), "lm_weights.hdf5 is not text (an hdf5?)"),
], ids=["lstm_dim", "projection_dim", "gelu", "no_char_cnn", "broken_json", "hdf5_as_options"])
def test_convert_from_elmo_refuses_options_that_do_not_describe_the_weights(make_options, names, tmp_path, capsys,
                                                                           monkeypatch):
    pytest.importorskip("h5py", reason="the bilm weights are hdf5")
    options = make_options(tmp_path)
    err = refused(["convert", "--from_elmo", str(ELMO / "lm_weights.hdf5"), "--elmo_options", options,
                   "--out", str(tmp_path / "run")], capsys, monkeypatch)
    assert names in err
    assert not (tmp_path / "run").exists()


# --- word2vec / GloVe text files given as a vector checkpoint


@pytest.mark.parametrize("text, names", [
    ("5 3\nthe 1 2 3\ncat 4 5 6\n", "ends after 2 of the 5 vectors its header announces"),
    ("Call me Ishmael. Some years ago\nnever mind how long precisely\n", ": line 1 holds a word followed by"),
    ("the 1 2 3\ncat 4 five 6\n", ": line 2 holds a word followed by"),
    ("2 3\nthe 1 2 3\ncat 4 nan 6\n", ": line 3 holds a NaN or infinite number"),
], ids=["fewer_rows_than_header", "prose", "non_numeric", "nan"])
def test_embed_refuses_a_vector_file_that_breaks_its_format(text, names, tmp_path, capsys, monkeypatch):
    vectors = tmp_path / "vectors.txt"
    vectors.write_text(text)
    err = refused(["embed", f"--gin.embed.checkpoint_path='{vectors}'", f"--output={tmp_path / 'out.npy'}",
                   "the cat"], capsys, monkeypatch)
    assert f"{vectors}{names}" in err or f"{vectors} {names}" in err, err
    assert not (tmp_path / "out.npy").exists()


# --- CoNLL-U and IOB2 (real UD English-EWT files, one field damaged)


def _damaged(source, tmp_path, line_number: int, column: int, value: str):
    """`source`'s first 40 lines, with field `column` of line `line_number` (1-based) set to `value`."""
    lines = source.read_text(encoding="utf-8").splitlines()[:40]
    fields = lines[line_number - 1].split("\t")
    fields[column] = value
    lines[line_number - 1] = "\t".join(fields)
    path = tmp_path / source.name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_conllu_head_outside_the_sentence_is_refused_naming_file_and_line(tmp_path):
    conllu = _damaged(DATA / "ud/en_ewt/en_ewt-ud-dev.conllu", tmp_path, 7, 6, "40")   # sentence 1, word 3
    with pytest.raises(DataError, match=rf"^{conllu}: sentence at line 1: word 3 \('AP'\) has HEAD '40', but the "
                                        "sentence has 7 words"):
        words.read_conll(str(conllu))
    assert words.read_conll(str(DATA / "ud/en_ewt/en_ewt-ud-dev.conllu"), limit=50)[0].heads == (3, 3, 4, 0, 6, 4, 4)


def _uner_data_dir(tmp_path, tag: str):
    """A data_dir whose UNER train file is the real dev file with word 8 of the first sentence tagged `tag`."""
    source = DATA / "ud/uner_en_ewt/en_ewt-ud-dev.iob2"
    (tmp_path / "uner_en_ewt").mkdir()
    lines = source.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("1\t"))
    fields = lines[start + 7].split("\t")
    fields[2] = tag
    lines[start + 7] = "\t".join(fields)
    path = tmp_path / "uner_en_ewt" / "en_ewt-ud-train.iob2"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_bio_errors_in_a_tagging_file_warn_once_naming_file_and_line(tmp_path, caplog):
    from t5lite.data import catalog
    path = _uner_data_dir(tmp_path, "I-ORG")     # word 7 is B-LOC in the real file
    with caplog.at_level(logging.WARNING, logger="t5lite"):
        examples = catalog.get_task_or_mixture("uner_en_ewt").source.read("train", str(tmp_path))
        catalog.get_task_or_mixture("uner_en_ewt").source.read("train", str(tmp_path))
        words.read_conll(str(path))
    warnings = [r.getMessage() for r in caplog.records if "IOB2" in r.getMessage()]
    assert warnings == [f"{path}: sentence at line 1, word 8: I-ORG after B-LOC; conlleval and seqeval count such "
                        "an I- as the start of an entity. Fix the tags (IOB2: B-TYPE starts an entity, I-TYPE "
                        "continues it); this file may break the scheme elsewhere too"]
    assert examples[0]["tags"][7] == "I-ORG"   # read as written: a warning, not a refusal


def test_a_clean_tagging_file_reads_without_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="t5lite"):
        words.read_conll(str(DATA / "ud/uner_en_ewt/en_ewt-ud-dev.iob2"))
    assert not [r for r in caplog.records if "IOB2" in r.getMessage()]


# --- gin includes


def test_an_include_of_a_missing_file_names_the_including_file_and_line(tmp_path, capsys, monkeypatch):
    outer = tmp_path / "outer.gin"
    inner = tmp_path / "inner.gin"
    outer.write_text(f"include 'configs/local/t5_tiny_pretrain.gin'\ninclude '{inner}'\n")
    inner.write_text("# settings\n\ninclude 'no/such/file.gin'\n")
    err = refused(["train", f"--gin_file={outer}"], capsys, monkeypatch)
    assert f"{inner}: line 3: include 'no/such/file.gin' is found in none of" in err
    err = refused(["sweep", f"--gin_file={outer}", f"--out={tmp_path / 'sweep'}"], capsys, monkeypatch)
    assert f"{inner}: line 3: include 'no/such/file.gin'" in err
    assert not (tmp_path / "sweep").exists()


def test_an_include_cycle_is_refused_instead_of_recursing(tmp_path, capsys, monkeypatch):
    (tmp_path / "a.gin").write_text(f"include '{tmp_path / 'b.gin'}'\n")
    (tmp_path / "b.gin").write_text(f"TRAIN_STEPS = 3\ninclude '{tmp_path / 'a.gin'}'\n")
    err = refused(["train", f"--gin_file={tmp_path / 'a.gin'}"], capsys, monkeypatch)
    assert f"{tmp_path / 'b.gin'}: line 2: include '{tmp_path / 'a.gin'}' makes a cycle (a.gin -> b.gin -> a.gin)" in err


# --- peft.json


@pytest.mark.parametrize("text, names", [
    ('{"method": "LoRA",\n "config": {', ": line 2: not valid JSON"),
    ('["LoRA"]', " has no method, config, base_checkpoint, base_fingerprint"),
    ('{"method": "LoRA", "config": {"r": 0}, "base_checkpoint": "x", "base_fingerprint": "y"}',
     ": its LoRA config does not build (ConfigError: LoRA.r=0"),
    ('{"method": "LoRA", "config": {"rank": 4}, "base_checkpoint": "x", "base_fingerprint": "y"}',
     ": its LoRA config does not build (TypeError"),
], ids=["broken", "not_a_record", "bad_value", "unknown_field"])
def test_a_damaged_peft_json_is_refused_naming_it(text, names, tmp_path):
    (tmp_path / "peft.json").write_text(text)
    with pytest.raises(CheckpointError, match="put back the file the run wrote") as e:
        peft_checkpoint.read(str(tmp_path))
    assert str(e.value).startswith(f"{tmp_path / 'peft.json'}{names}")


# --- a run whose data gives the objective nothing to train on


def _one_sentence_paragraphs(tmp_path) -> str:
    """A data_dir whose WikiText-2 holds the first sentence of each real paragraph: no consecutive pair."""
    from t5lite.data.consecutive_sentences import split_sentences
    corpus = tmp_path / "data" / "text" / "wikitext-2"
    corpus.mkdir(parents=True)
    lines = (DATA / "text/wikitext-2/valid.txt").read_text(encoding="utf-8").splitlines()[:200]
    firsts = [f" {split_sentences(line)[0]} " for line in lines if split_sentences(line)]
    (corpus / "train.txt").write_text("\n".join(firsts) + "\n", encoding="utf-8")
    return str(tmp_path / "data")


@pytest.mark.parametrize("config, objective", [
    ("bert_tiny_quick_thought", "QuickThoughtObjective"),
    pytest.param("bert_tiny_skip_thought", "SkipThoughtObjective", marks=pytest.mark.slow),
])
def test_a_corpus_without_consecutive_sentences_refuses_to_train(config, objective, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    err = refused(["train", f"--gin_file=configs/local/{config}.gin", f"--gin.MODEL_DIR='{run}'",
                   f"--gin.DATA_DIR='{_one_sentence_paragraphs(tmp_path)}'", "--gin.TASK_FEATURE_LENGTHS={'text0': 16}",
                   "--gin.BATCH_SIZE=4", "--gin.TRAIN_STEPS=2", "--gin.train.checkpoint_every=1"],
                  capsys, monkeypatch)
    assert f"task 'wikitext2' split 'train': the first batch gives {objective} nothing to train on" in err
    assert not any((run / "checkpoints").glob("*")) and not (run / "metrics.jsonl").exists()


# --- a peft LoRA folder whose adapter_config.json disagrees with its tensors


@pytest.mark.parametrize("change, names", [
    ({"r": 2}, "query.lora_A has rank 4, but r and rank_pattern give it 2"),
    ({"r": "4"}, "adapter_config.json has r='4'"),
], ids=["rank", "text"])
def test_a_peft_adapter_whose_config_disagrees_with_its_tensors_is_refused(change, names, tmp_path, capsys,
                                                                          monkeypatch):
    transformers = pytest.importorskip("transformers", reason="a real peft folder needs transformers")
    peft = pytest.importorskip("peft", reason="a real peft folder needs peft")
    config = transformers.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40)
    model = transformers.BertForMaskedLM(config)
    model.save_pretrained(str(tmp_path / "base"))
    peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["query"])).save_pretrained(str(tmp_path / "lora"))
    adapter_config = tmp_path / "lora" / "adapter_config.json"
    adapter_config.write_text(json.dumps({**json.loads(adapter_config.read_text()), **change}))
    err = refused(["convert", "--from_hf", str(tmp_path / "base"), "--peft_adapter", str(tmp_path / "lora"),
                   "--out", str(tmp_path / "run")], capsys, monkeypatch)
    assert names in err
    assert not (tmp_path / "run").exists()
