"""t5lite.data.sources on small files written in tmp_path: readers, malformed-row policy,
split lookup, shuffling and per-host sharding."""
import logging

import numpy as np
import pytest

from t5lite.data import sources as S
from t5lite.errors import DataError, DataNotFoundError


def _write(path, text: str | bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return str(path)


TABLE = S.Table({"sentence": "sentence", "label": "label"}, convert={"label": int}, defaults={"label": -1})


def test_table_reads_header_bom_and_numbers_rows(tmp_path):
    path = _write(tmp_path / "a.tsv", "\ufeffsentence\tlabel\nit 's fine . \t1\n\nbad \" quote\t0")
    assert list(TABLE(path)) == [(2, {"sentence": "it 's fine . ", "label": 1, "idx": 0}),
                                 (4, {"sentence": 'bad " quote', "label": 0, "idx": 1})]


def test_table_without_label_column_uses_default(tmp_path):
    path = _write(tmp_path / "test.tsv", "index\tsentence\n0\thello\n")
    assert [ex for _, ex in TABLE(path)] == [{"sentence": "hello", "label": -1, "idx": 0}]


def test_table_headerless_file(tmp_path):
    table = S.Table({"sentence": "sentence", "label": "label"}, convert={"label": int},
                    headerless=("source", "label", "star", "sentence"))
    path = _write(tmp_path / "cola.tsv", "gj04\t1\t\tA fine one.\ngj04\t0\t*\tOne fine a.")
    assert [ex["label"] for _, ex in table(path)] == [1, 0]


def test_table_without_needed_header_is_a_file_error(tmp_path):
    path = _write(tmp_path / "a.tsv", "x\ty\n1\t2\n")
    with pytest.raises(ValueError, match=r"expected a header naming the columns \['sentence'\]"):
        list(TABLE(path))


def test_quoted_csv_with_newlines_in_fields(tmp_path):
    table = S.Table({"article": "article", "highlights": "highlights"}, delimiter=",", quoted=True, index_key=None)
    path = _write(tmp_path / "a.csv", 'article,highlights,id\n"line one\nline two","sum, mary",x1\nb,c,x2\n')
    assert list(table(path)) == [(2, {"article": "line one\nline two", "highlights": "sum, mary"}),
                                 (4, {"article": "b", "highlights": "c"})]


BAD_TSV = "sentence\tlabel\ngood one\t1\ntoo\tmany\tfields\nbad label\tx\ngood two\t0\n"


def _source(policy=None):
    return S.FileSource({"train": "train.tsv", "validation": ["dev.tsv", "valid.tsv"]}, TABLE, on_malformed=policy)


def test_malformed_rows_fail_with_file_and_line(tmp_path):
    _write(tmp_path / "train.tsv", BAD_TSV)
    with pytest.raises(S.MalformedRowError, match=r"train\.tsv:3: expected 2 fields"):
        list(_source("fail").load("train", data_dir=str(tmp_path)))


def test_malformed_rows_skipped_and_counted(tmp_path, caplog):
    _write(tmp_path / "train.tsv", BAD_TSV)
    with caplog.at_level(logging.WARNING, logger="t5lite.data.sources"):
        rows = list(_source("skip").load("train", data_dir=str(tmp_path)))
    assert [r["sentence"] for r in rows] == ["good one", "good two"]
    assert [r["idx"] for r in rows] == [0, 3]  # ids stay those of the file, whatever is skipped
    assert "skipped 2 malformed row(s)" in caplog.text and "train.tsv:3:" in caplog.text


def test_default_policy_is_fail_and_settable(tmp_path, monkeypatch):
    _write(tmp_path / "train.tsv", BAD_TSV)
    with pytest.raises(S.MalformedRowError):
        list(_source().load("train", data_dir=str(tmp_path)))
    monkeypatch.setattr(S, "_default_policy", S._default_policy)  # restored after the test
    S.set_malformed_policy("skip")
    assert len(list(_source().load("train", data_dir=str(tmp_path)))) == 2
    with pytest.raises(ValueError, match="policy must be one of"):
        S.set_malformed_policy("ignore")


def test_policy_is_a_gin_setting(tmp_path, monkeypatch):
    import gin
    _write(tmp_path / "train.tsv", BAD_TSV)
    monkeypatch.setattr(S, "_default_policy", "fail")
    gin.clear_config()
    try:
        gin.parse_config("malformed_rows.policy = 'skip'")
        assert [r["sentence"] for r in _source().load("train", data_dir=str(tmp_path))] == ["good one", "good two"]
        gin.parse_config("malformed_rows.policy = 'ignore'")
        with pytest.raises(DataError, match="malformed_rows.policy must be one of"):
            _source().load("train", data_dir=str(tmp_path))
    finally:
        gin.clear_config()
    with pytest.raises(S.MalformedRowError, match="malformed_rows.policy"):  # the failure says how to skip
        _source().load("train", data_dir=str(tmp_path))


@pytest.mark.parametrize("text, policy", [(b"", "fail"), (b"\n\n", "fail"),
                                          (b"sentence\tlabel\nno label\nbad\tx\n", "skip")])
def test_a_split_without_examples_is_an_error_naming_the_file(tmp_path, text, policy):
    path = _write(tmp_path / "train.tsv", text)
    with pytest.raises(DataError, match=f"split 'train' has no examples: {path}"):
        _source(policy).load("train", data_dir=str(tmp_path))


def test_missing_local_files_and_tfds_say_what_is_looked_for_and_how_to_prepare(tmp_path):
    class MissingTfds(S.TfdsSource):
        def data_source(self, split, data_dir):
            raise DataNotFoundError(f"TFDS {self.name!r} is not prepared") from NotImplementedError("TFRECORD")

    src = S.FilesOrTfds(_source(), MissingTfds("glue/sst2", splits=("train",)))
    with pytest.raises(DataNotFoundError) as raised:
        src.load("train", data_dir=str(tmp_path))
    message = str(raised.value)
    assert f"split 'train' not found in data_dir {tmp_path}" in message and "'train.tsv'" in message
    assert f"tfds build glue/sst2 --data_dir={tmp_path} --file_format=array_record" in message


def test_bad_utf8_line_is_a_malformed_row(tmp_path):
    path = _write(tmp_path / "a.txt", b"first line\n\xff\xfe broken\nthird line\n")
    rows = list(S.TextLines()(path))
    assert rows[0] == (1, {"text": "first line"}) and isinstance(rows[1][1], S.Malformed) and rows[1][0] == 2


def test_split_alternatives_and_missing_files(tmp_path):
    src = _source()
    _write(tmp_path / "valid.tsv", "sentence\tlabel\nv\t1\n")
    assert src.files("validation", str(tmp_path)) == [str(tmp_path / "valid.tsv")]
    assert src.files("train", str(tmp_path)) == []
    with pytest.raises(FileNotFoundError, match="no file for split 'train'"):
        src.load("train", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        src.load("dev", data_dir=str(tmp_path))


def test_glob_reads_all_matches_in_order(tmp_path):
    _write(tmp_path / "train-1.jsonl", '{"t": "b"}\n')
    _write(tmp_path / "train-0.jsonl", '{"t": "a"}\n{"t": "c", "x": 1}\n')
    src = S.FileSource({"train": "train-*.jsonl"}, S.JsonLines({"text": "t"}))
    assert [ex["text"] for ex in src.load("train", data_dir=str(tmp_path))] == ["a", "c", "b"]


def test_json_lines_malformed(tmp_path):
    path = _write(tmp_path / "a.jsonl", '{"t": "a"}\nnot json\n[1]\n{"u": 1}\n')
    rows = list(S.JsonLines({"text": "t"})(path))
    assert rows[0] == (1, {"text": "a"})
    assert [(n, type(r).__name__) for n, r in rows[1:]] == [(2, "Malformed"), (3, "Malformed"), (4, "Malformed")]
    assert "missing key(s) ['t']" in rows[3][1].reason


def test_parallel_text_aligned_and_misaligned(tmp_path):
    _write(tmp_path / "news.en", "Hello .\nBye .\n")
    _write(tmp_path / "news.de", "Hallo .\nTschüss .\n")
    reader = S.ParallelText(("en", "de"))
    assert [ex for _, ex in reader(str(tmp_path / "news"))] == [{"en": "Hello .", "de": "Hallo ."},
                                                              {"en": "Bye .", "de": "Tschüss ."}]
    _write(tmp_path / "short.en", "a\nb\n")
    _write(tmp_path / "short.de", "a\n")
    with pytest.raises(ValueError, match="not aligned"):
        list(reader(str(tmp_path / "short")))


def _numbers_source():
    return S.FileSource({"train": "n.txt"}, S.TextLines())


def test_shuffle_is_a_deterministic_permutation(tmp_path):
    _write(tmp_path / "n.txt", "".join(f"{i}\n" for i in range(100)))
    load = lambda **kw: [ex["text"] for ex in _numbers_source().load("train", data_dir=str(tmp_path), **kw)]
    plain = load()
    assert plain == [str(i) for i in range(100)]
    a, b, c = load(shuffle=True, seed=1), load(shuffle=True, seed=1), load(shuffle=True, seed=2)
    assert a == b and a != c and a != plain and sorted(a) == sorted(plain)


@pytest.mark.parametrize("shard_count", [2, 3, 8])
def test_shards_are_disjoint_and_cover_the_split(tmp_path, shard_count):
    _write(tmp_path / "n.txt", "".join(f"{i}\n" for i in range(101)))
    shards = [[ex["text"] for ex in _numbers_source().load("train", data_dir=str(tmp_path), shuffle=True, seed=3,
                                                          shard_index=i, shard_count=shard_count)]
              for i in range(shard_count)]
    flat = [x for s in shards for x in s]
    assert len(flat) == len(set(flat)) == 101
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_files_or_tfds_prefers_files_only_when_present(tmp_path):
    class FakeTfds:
        splits = ("train", "validation")

        def load(self, split, **kwargs):
            return iter([{"from": "tfds", "data_dir": kwargs["data_dir"]}])

    _write(tmp_path / "train.tsv", "sentence\tlabel\nfrom files\t1\n")
    src = S.FilesOrTfds(_source(), FakeTfds())
    assert next(src.load("train", data_dir=str(tmp_path)))["sentence"] == "from files"
    assert next(src.load("validation", data_dir=str(tmp_path)))["from"] == "tfds"
    assert next(src.load("train"))["data_dir"] is None


def test_to_python_converts_tfds_values():
    value = {"a": np.array(3), "b": b"x\xc3\xa9", "c": np.array([b"p", b"q"]),
             "d": {"e": np.array(["u", "v"]), "f": np.array([1, 2], dtype=np.int32)}, "g": np.float32(0.5)}
    assert S.to_python(value) == {"a": 3, "b": "xé", "c": ["p", "q"], "d": {"e": ["u", "v"], "f": [1, 2]}, "g": 0.5}


def test_gzipped_json_lines(tmp_path):
    import gzip
    (tmp_path / "train.jsonl.gz").write_bytes(gzip.compress(b'{"t": "zipped"}\n'))
    src = S.FileSource({"train": "train.jsonl*"}, S.JsonLines({"text": "t"}))
    assert list(src.load("train", data_dir=str(tmp_path))) == [{"text": "zipped"}]
