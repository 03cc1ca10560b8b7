"""`t5lite prepare --task`: registered tasks' text, without labels, as a pre-training corpus (the
classroom corpus of docs/guides/data.md). The expected documents are read here from the shared
data's files with `csv` and `json`, not through t5lite's readers."""
from __future__ import annotations

import csv
import json
import re
import shutil

import pytest

from conftest import shared_data_dir
from t5lite import cli
from t5lite.data import get_task
from t5lite.data.prepare import Options, prepare
from t5lite.data.prepared import PreparedShards
from t5lite.errors import DataError

DATA = shared_data_dir()
OPTIONS = Options(language_filter=False)


def _lines(*texts: str) -> list[str]:
    return [" ".join(line.split()) for text in texts for line in text.splitlines() if line.strip()]


def first_copies(lines: list[str]) -> list[str]:
    """Each line at its first copy, lines compared lower-cased (C4's de-duplication, REFERENCE.md)."""
    seen, first = set(), []
    for line in lines:
        if line.lower() not in seen:
            seen.add(line.lower())
            first.append(line)
    return first


def rte_rows(path=DATA / "glue" / "RTE" / "train.tsv") -> list[list[str]]:
    """Each RTE training pair's lines."""
    with open(path, encoding="utf-8", newline="") as f:
        return [_lines(row["sentence1"], row["sentence2"])
                for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]


def rte_lines() -> list[str]:
    return [line for row in rte_rows() for line in row]


def rows_with_a_new_line(rows: list[list[str]]) -> int:
    """The documents de-duplication leaves: those with a line no earlier one has."""
    seen, count = set(), 0
    for row in rows:
        keys = {line.lower() for line in row}
        count += bool(keys - seen)
        seen |= keys
    return count


def squad_lines() -> list[str]:
    data = json.loads((DATA / "squad" / "v1.1" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    return [line for article in data for paragraph in article["paragraphs"] for qa in paragraph["qas"]
            for line in _lines(paragraph["context"], qa["question"])]


def cnn_rows() -> list[dict]:
    with open(DATA / "summarization" / "cnn_dailymail" / "cnn_dailymail_validation_subset.csv", encoding="utf-8",
              newline="") as f:
        return list(csv.DictReader(f))


def wikitext_lines() -> list[str]:
    return _lines((DATA / "text" / "wikitext-2" / "valid.txt").read_text(encoding="utf-8"))


def glue_copy(tmp_path):
    """A data layout the tasks read: GLUE's RTE, SQuAD v1.1, the CNN/DailyMail subset, WikiText-2."""
    root = tmp_path / "data"
    (root / "glue" / "RTE").mkdir(parents=True)
    shutil.copy(DATA / "glue" / "RTE" / "train.tsv", root / "glue" / "RTE" / "train.tsv")
    (root / "squad").symlink_to(DATA / "squad" / "v1.1")
    (root / "cnn").symlink_to(DATA / "summarization" / "cnn_dailymail")
    (root / "text").symlink_to(DATA / "text")
    return root


def tasks(root) -> list[str]:
    return [f"task:glue_rte={root}/glue", f"task:squad_v1:validation={root}/squad",
            f"task:cnn_dailymail:validation={root}/cnn", f"task:wikitext2:validation={root}"]


def test_task_text_becomes_documents_each_line_kept_once_and_no_label(tmp_path):
    root = glue_copy(tmp_path)
    out = tmp_path / "corpus"
    manifest = prepare(tasks(root), str(out), options=OPTIONS, progress=False)
    kept = [line for doc in PreparedShards(str(out)) for line in doc["text"].split("\n")]
    cnn = cnn_rows()
    expected = [*rte_lines(), *squad_lines(), *(line for row in cnn for line in _lines(row["article"])),
                *wikitext_lines()]
    # Tasks in the order given, records in file order; a line repeated anywhere is kept the first time only.
    assert kept == first_copies(expected)
    assert len(expected) - len(kept) == manifest["counts"]["line_duplicate"] > 5000   # SQuAD's repeated contexts
    assert manifest["counts"]["documents_in"] == 2490 + 10570 + len(cnn) + len(wikitext_lines())
    highlights = {line for row in cnn for line in _lines(row["highlights"])}
    assert highlights and not highlights & set(kept)   # CNN/DailyMail's summaries are its labels
    assert [s["input"] for s in manifest["shards"]] == [
        f"task:glue_rte:train={root}/glue", *tasks(root)[1:3],
        f"task:wikitext2:validation={root}"]


def test_task_and_file_inputs_mix_and_a_changed_task_file_is_noticed(tmp_path):
    root = glue_copy(tmp_path)
    page = tmp_path / "page.txt"
    page.write_text("Crawled page.\nIt has three sentences here.\nOnly C4's rules clean it, so this line stays!\n")
    out = tmp_path / "mixed"
    manifest = prepare([str(page), f"task:glue_rte={root}/glue"], str(out), options=Options(language_filter=False,
                       min_num_sentences=1, min_words_per_line=3), progress=False)
    docs = list(PreparedShards(str(out)))
    assert docs[0]["text"] == "It has three sentences here.\nOnly C4's rules clean it, so this line stays!"
    assert [d["text"] for d in docs[1:4]] == ["\n".join(row) for row in rte_rows()[:3]]
    assert manifest["counts"]["line_too_few_words"] == 1   # C4's line filter cleans the file, never the task
    with open(root / "glue" / "RTE" / "train.tsv", "a", encoding="utf-8") as f:
        f.write("9999\tA sentence added later.\tAnother one.\tentailment\n")
    with pytest.raises(DataError, match="glue_rte.*changed after the preparation"):
        prepare([str(page), f"task:glue_rte={root}/glue"], str(out), options=Options(
            language_filter=False, min_num_sentences=1, min_words_per_line=3), progress=False)


def test_every_family_pretraining_task_reads_a_prepared_corpus_from_its_data_dir(tmp_path):
    root = glue_copy(tmp_path)
    prepare([f"task:glue_rte={root}/glue"], str(tmp_path / "corpus" / "train"), options=OPTIONS, progress=False)
    prepare([f"task:wikitext2:validation={root}"], str(tmp_path / "corpus" / "validation"), options=OPTIONS,
            split="validation", progress=False)
    corpus = str(tmp_path / "corpus")
    for name in ("embedded_docs_bert_mlm", "embedded_docs_bert_nsp_mlm", "embedded_docs_span_corruption",
                 "embedded_docs_causal_lm"):
        source = get_task(name).source
        assert source.num_examples("train", data_dir=corpus) == rows_with_a_new_line(rte_rows()) < 2490
        assert source.num_examples("validation", data_dir=corpus) == len(PreparedShards(f"{corpus}/validation"))
        assert source.records("train")[0]["text"] != source.records("train", data_dir=corpus)[0]["text"]
    first = next(iter(get_task("embedded_docs_bert_mlm").get_dataset("train", {"inputs": 64, "targets": 64},
                                                                    data_dir=corpus)))
    assert len(first["inputs"]) <= 64


def test_wikitext103_reads_the_raw_release_names(tmp_path):
    folder = tmp_path / "text" / "wikitext-103"
    folder.mkdir(parents=True)
    (folder / "wiki.valid.raw").write_text(" \n = Title = \n \n The first paragraph. It ends.\n")
    records = get_task("wikitext103").source.records("validation", str(tmp_path))
    assert [r["text"] for r in records] == [" = Title = ", " The first paragraph. It ends."]


@pytest.mark.parametrize("spec, message", [
    ("glue_rte", "write it NAME\\[:SPLIT\\]=DATA_DIR"),
    ("glue_rtee={root}/glue", "unknown task 'glue_rtee'.*glue_rte"),
    ("glue_rte:dev={root}/glue", "no split 'dev'; it has"),
    ("glue_sst2={root}/glue", "SST-2/train.tsv"),
])
def test_task_typos_exit_2_naming_the_input_and_the_fix(tmp_path, capsys, spec, message):
    root = glue_copy(tmp_path)
    with pytest.raises(SystemExit) as e:
        cli.main(["prepare", "--task", spec.format(root=root), "--output", str(tmp_path / "out")])
    assert e.value.code == 2
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1 and re.search(message, error), error
    assert not (tmp_path / "out").exists()   # nothing written


def test_cli_prints_the_data_dir_to_train_with(tmp_path, capsys):
    root = glue_copy(tmp_path)
    cli.main(["prepare", "--task", f"glue_rte={root}/glue", "--output", str(tmp_path / "c" / "train"),
              "--no_language_filter"])
    assert f"kept {rows_with_a_new_line(rte_rows())} of 2490 documents in 1 shard(s) in {tmp_path}/c/train; train on them with " \
           f"data_dir={tmp_path}/c" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli.main(["prepare", "--output", str(tmp_path / "none")])
    assert e.value.code == 2


def test_list_fields_give_one_line_per_string_and_other_values_none():
    from t5lite.data.registry import FunctionSource, TaskRegistry
    from t5lite.data.task_documents import TaskInput
    rows = [{"passage": ["First  passage.", "Second\nline."], "question": 7, "label": "yes"},
            {"passage": "", "question": "Only a question?"}, {"passage": None, "question": None}]
    TaskRegistry.add("my_list_texts", source=FunctionSource(lambda split: rows, splits=("train",)),
                     preprocessors=[], output_features={})
    try:
        documents = list(TaskInput.parse("my_list_texts=unused").documents())
    finally:
        TaskRegistry.remove("my_list_texts")
    assert documents == [(0, "", "First passage.\nSecond\nline."), (1, "", "Only a question?")]


def test_a_task_without_text_fields_is_refused_naming_its_fields(tmp_path):
    from t5lite.data.registry import FunctionSource, TaskRegistry
    TaskRegistry.add("my_numbers", source=FunctionSource(lambda split: [{"label": 1, "idx": 0}], splits=("train",)),
                     preprocessors=[], output_features={})
    try:
        with pytest.raises(DataError, match=r"--task my_numbers: its records have no text field \(idx, label;"):
            prepare([f"task:my_numbers={tmp_path}"], str(tmp_path / "out"), options=OPTIONS, progress=False)
    finally:
        TaskRegistry.remove("my_numbers")
