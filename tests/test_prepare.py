"""`t5lite prepare` on small crafted corpora: real sentences from the shared data (WikiText, WMT German)
with injected boilerplate. Every expected count and text below is derived here from how the pages are
built, per C4's rules as REFERENCE.md states them, not from t5lite's own output."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, shared_data_dir
from t5lite import cli
from t5lite.data import get_task
from t5lite.data.prepare import Options, prepare, read_documents
from t5lite.data.prepared import PreparedShards, PreparedSource
from t5lite.data.registry import TaskRegistry
from t5lite.errors import ConfigError, DataError, DataNotFoundError

BOILERPLATE = ["lorem", "javascript", "cookie", "policy", "terms of use", "{", "zorblax"]
COOKIE = "This website uses cookies to give you the best experience online."
JAVASCRIPT = "Please enable JavaScript in your browser to watch this video."
NAV = "Home | News | Sport | Weather | Contact us"
SHORT = "Share this article."
TRAILING = "Read the full story in our news archive..."
LONG_WORD = "Our tracking link is " + "x" * 1001 + " for this page."
FOOTER = "Subscribe to our newsletter for the latest news and updates."
LOREM = "Lorem ipsum dolor sit amet, consectetur adipiscing elit."
CODE = "The widget runs the code function init() { return true; } on load."
BAD = "The zorblax word is on the list of words nobody should read, page {}."


def wikitext_sentences(count: int) -> list[str]:
    """Distinct WikiText sentences of 6-40 words whose only end mark is the final " ." (one sentence each)."""
    text = (shared_data_dir() / "text" / "wikitext-2" / "valid.txt").read_text(encoding="utf-8")
    found, seen = [], set()
    for paragraph in text.splitlines():
        for sentence in paragraph.split(" . "):
            sentence = sentence.strip().rstrip(" .") + " ."
            words = sentence.split()
            one_end_mark = not re.search(r"[.?!\"\[\]{}]", sentence[:-1])
            if (6 <= len(words) <= 40 and one_end_mark and not sentence.startswith("=")
                    and not any(b in sentence.lower() for b in BOILERPLATE) and sentence.lower() not in seen):
                seen.add(sentence.lower())
                found.append(sentence)
                if len(found) == count:
                    return found
    raise AssertionError("not enough WikiText sentences")


def german_lines(count: int) -> list[str]:
    lines = (shared_data_dir() / "wmt" / "de-en" / "newstest2014-deen.de").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if len(line.split()) >= 8 and line.endswith(".")][:count]


def crafted_corpus(tmp_path):
    """Pages without URLs (so the first copy of a line in input order keeps it) in four files of
    both kinds, gzip and plain. Returns (input dir, {reason: expected count}, expected kept texts)."""
    sentences = iter(wikitext_sentences(200))
    take = lambda n: [next(sentences) for _ in range(n)]  # noqa: E731
    good, expected_texts, pages = [], [], []
    line_counts = dict(line_long_word=0, line_no_end_mark=0, line_too_few_words=0, line_javascript=0, line_policy=0,
                       line_duplicate=0)
    for k in range(12):
        lines = take(4)
        kept = list(lines)
        extra = [[COOKIE, LONG_WORD], [JAVASCRIPT], [NAV, SHORT], [TRAILING]][k % 4]
        line_counts["line_policy"] += COOKIE in extra
        line_counts["line_long_word"] += LONG_WORD in extra
        line_counts["line_javascript"] += JAVASCRIPT in extra
        line_counts["line_no_end_mark"] += (NAV in extra) + (TRAILING in extra)
        line_counts["line_too_few_words"] += SHORT in extra
        if k == 3:                                  # a citation marker goes, the line stays
            lines[0] = lines[0][:-2] + "[1]."
            kept[0] = kept[0][:-2] + "."
        if k == 5:                                  # a line repeated on its own page: first copy only
            lines.append(lines[1])
            line_counts["line_duplicate"] += 1
        if k == 6:                                  # another page's line, upper-cased: compared lower-cased
            lines.append(good[0][1].upper())
            line_counts["line_duplicate"] += 1
        page = lines[:2] + extra + lines[2:] + [FOOTER]
        if k == 0:
            kept.append(FOOTER)                     # the first page in input order keeps the shared footer
        else:
            line_counts["line_duplicate"] += 1
        good.append(lines)
        pages.append("\n".join(page))
        expected_texts.append("\n".join(kept))
    dropped = {
        "page_lorem_ipsum": ["\n".join(take(4) + [LOREM]) for _ in range(2)],
        "page_curly_brace": ["\n".join(take(4) + [CODE]) for _ in range(2)],
        "page_too_few_sentences": ["\n".join(take(2) + [NAV]) for _ in range(3)],
        "page_too_long": ["\n".join(take(4) + ["filler " * 3000])],
        "page_bad_words": ["\n".join(take(4) + [BAD.format(i)]) for i in range(2)],  # a shared one would go as a copy
        # every line already kept by an earlier page: nothing left after de-duplication
        "page_too_few_sentences_after_dedupe": ["\n".join(good[1][:3] + [FOOTER]), "\n".join(good[2] + [FOOTER])],
    }
    line_counts["line_duplicate"] += 4 + 5
    page_counts = {reason: len(texts) for reason, texts in dropped.items()}
    first = pages[:6] + dropped["page_lorem_ipsum"] + dropped["page_curly_brace"] + dropped["page_too_long"]
    second = pages[6:10] + dropped["page_too_few_sentences"] + dropped["page_bad_words"]
    folder = tmp_path / "raw"
    folder.mkdir()
    with gzip.open(folder / "a.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in first)
    (folder / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" + "\n" for t in second), encoding="utf-8")
    (folder / "c.txt").write_text(pages[10], encoding="utf-8")
    with gzip.open(folder / "d.txt.gz", "wt", encoding="utf-8") as f:
        f.write(pages[11])
    (folder / "e.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                            for t in dropped["page_too_few_sentences_after_dedupe"]), encoding="utf-8")
    everything = first + second + pages[10:12] + dropped["page_too_few_sentences_after_dedupe"]
    expected = {**line_counts, **page_counts, "page_not_english": 0, "page_empty_after_dedupe": 0,
                "documents_in": len(everything),
                "characters_in": sum(map(len, everything)), "documents_kept": len(expected_texts),
                "characters_kept": sum(map(len, expected_texts))}
    return folder, expected, expected_texts


OPTIONS = Options(max_page_length=20000, language_filter=False, bad_words=("zorblax",))


def test_each_filter_count_and_the_kept_text(tmp_path):
    folder, expected, texts = crafted_corpus(tmp_path)
    manifest = prepare([str(folder / "*")], str(tmp_path / "out"), options=OPTIONS, progress=False)
    assert manifest["counts"] == expected
    shards = PreparedShards(str(tmp_path / "out"))
    assert [d["text"] for d in shards] == texts
    assert [s["records"] for s in manifest["shards"]] == [6, 4, 1, 1, 0]
    assert sorted(os.listdir(tmp_path / "out")) == ["manifest.json"] + [s["file"] for s in manifest["shards"]]


def test_two_workers_give_the_same_shards_as_one(tmp_path):
    folder, _, _ = crafted_corpus(tmp_path)
    one = prepare([str(folder / "*")], str(tmp_path / "one"), workers=1, options=OPTIONS, progress=False,
                  command="same")
    two = prepare([str(folder / "*")], str(tmp_path / "two"), workers=2, options=OPTIONS, progress=False,
                  command="same")
    assert one == two
    assert list(PreparedShards(str(tmp_path / "one"))) == list(PreparedShards(str(tmp_path / "two")))


def test_line_owner_is_the_page_with_the_smallest_url_md5(tmp_path):
    shared = "This exact sentence was copied onto several web pages."
    lines = wikitext_sentences(9)
    urls = [f"http://site{i}.example/page" for i in range(3)]
    owner = min(urls, key=lambda u: hashlib.md5(u.encode()).hexdigest())
    (tmp_path / "in.jsonl").write_text("".join(
        json.dumps({"url": url, "text": "\n".join(lines[3 * i:3 * i + 3] + [shared])}) + "\n"
        for i, url in enumerate(urls)))
    prepare([str(tmp_path / "in.jsonl")], str(tmp_path / "out"), options=OPTIONS, progress=False)
    docs = {d["url"]: d["text"] for d in PreparedShards(str(tmp_path / "out"))}
    assert docs == {url: "\n".join(lines[3 * i:3 * i + 3] + ([shared] if url == owner else []))
                    for i, url in enumerate(urls)}


def test_language_filter_drops_german_pages(tmp_path):
    pytest.importorskip("langdetect", reason="language id needs the optional langdetect package (extra c4)")
    english, german = wikitext_sentences(8), german_lines(8)
    pages = ["\n".join(english[:4]), "\n".join(german[:4]), "\n".join(english[4:]), "\n".join(german[4:])]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in pages))
    manifest = prepare([str(tmp_path / "in.jsonl")], str(tmp_path / "out"), options=Options(), progress=False)
    assert manifest["counts"]["page_not_english"] == 2
    assert [d["text"] for d in PreparedShards(str(tmp_path / "out"))] == [pages[0], pages[2]]


def _run_cli(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "t5lite.cli", "prepare", *args], cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _manifest(folder):
    try:
        with open(os.path.join(folder, "manifest.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


@pytest.mark.parametrize("stage", [pytest.param("cleaned", marks=pytest.mark.slow), "filtered"])
def test_restart_after_kill_finishes_without_redoing_shards(tmp_path, stage):
    sentences = wikitext_sentences(1200)
    folder = tmp_path / "raw"
    folder.mkdir()
    for f in range(40):
        with gzip.open(folder / f"part{f:02d}.jsonl.gz", "wt") as out:
            for d in range(30):
                start = (f * 30 + d) % 1150
                out.write(json.dumps({"text": "\n".join(sentences[start:start + 6] + [FOOTER])}) + "\n")
    args = ["--input", str(folder / "*.jsonl.gz"), "--no_language_filter", "--workers", "2"]
    killed = str(tmp_path / "killed")
    run = _run_cli(*args, "--output", killed)
    deadline = time.time() + 120
    while not _manifest(killed).get(stage) and run.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    at_kill = _manifest(killed)
    assert at_kill.get("status") == "running" and at_kill[stage], "the run ended before it could be killed"
    done = {s: os.stat(os.path.join(killed, f"train-{int(s):05d}-of-00040.array_record")).st_mtime_ns
            for s in at_kill.get("filtered", {})}
    assert _run_cli(*args, "--output", killed).wait() == 0
    assert _run_cli(*args, "--output", str(tmp_path / "whole")).wait() == 0
    for s, mtime in done.items():  # shards finished before the kill were not written again
        assert os.stat(os.path.join(killed, f"train-{int(s):05d}-of-00040.array_record")).st_mtime_ns == mtime
    restarted, whole = _manifest(killed), _manifest(tmp_path / "whole")
    assert {k: v for k, v in restarted.items() if k != "command"} == {k: v for k, v in whole.items() if k != "command"}
    assert list(PreparedShards(killed)) == list(PreparedShards(str(tmp_path / "whole")))
    assert sorted(os.listdir(killed)) == sorted(os.listdir(tmp_path / "whole"))  # no work files or partial shards


def test_rerun_of_a_finished_folder_changes_nothing_and_other_options_are_refused(tmp_path):
    folder, _, _ = crafted_corpus(tmp_path)
    out = str(tmp_path / "out")
    first = prepare([str(folder / "*")], out, options=OPTIONS, progress=False)
    assert prepare([str(folder / "*")], out, options=OPTIONS, progress=False) == first
    with pytest.raises(ConfigError, match="other options"):
        prepare([str(folder / "*")], out, options=Options(language_filter=False), progress=False)


def test_cli_errors_name_the_input_and_the_fix(tmp_path, capsys):
    outputs = iter(range(10))

    def error(*args):
        with pytest.raises(SystemExit) as e:
            cli.main(["prepare", *args, "--output", str(tmp_path / f"out{next(outputs)}")])
        assert e.value.code == 2
        return capsys.readouterr().err
    assert "no file matches" in error("--input", str(tmp_path / "nothing*.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    assert "hold no document" in error("--input", str(tmp_path / "empty.jsonl"))
    with gzip.open(tmp_path / "whole.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": " ".join(wikitext_sentences(50))}) + "\n" for _ in range(20))
    data = (tmp_path / "whole.jsonl.gz").read_bytes()
    (tmp_path / "cut.jsonl.gz").write_bytes(data[:len(data) // 2])
    message = error("--input", str(tmp_path / "cut.jsonl.gz"))
    assert "cut.jsonl.gz" in message and "truncated gzip" in message
    (tmp_path / "plain.txt.gz").write_text("A page that was never compressed, whatever its name says.")
    assert "plain.txt.gz: damaged or truncated gzip" in error("--input", str(tmp_path / "plain.txt.gz"))
    (tmp_path / "folder.txt").mkdir()  # unreadable as a file (root reads files whatever their mode)
    with pytest.raises(DataError, match="folder.txt: cannot read it"):
        list(read_documents(str(tmp_path / "folder.txt")))
    (tmp_path / "bad.jsonl").write_text('{"text": "fine line here."}\n{"url": "no text"}\n')
    assert "bad.jsonl:2" in error("--input", str(tmp_path / "bad.jsonl"))


def test_reader_errors_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(DataNotFoundError, match="t5lite prepare"):
        PreparedShards(str(tmp_path))
    folder, _, _ = crafted_corpus(tmp_path)
    out = tmp_path / "out"
    manifest = prepare([str(folder / "*")], str(out), options=OPTIONS, progress=False)
    shard = out / manifest["shards"][0]["file"]
    shard.write_bytes(shard.read_bytes()[:200])
    with pytest.raises(DataError, match=f"{shard.name}.*truncated.*prepare the data again"):
        PreparedShards(str(out))
    shard.unlink()
    with pytest.raises(DataError, match=f"{shard.name}: shard missing"):
        PreparedShards(str(out))


def test_tasks_read_prepared_shards(tmp_path):
    folder, _, texts = crafted_corpus(tmp_path)
    out = str(tmp_path / "out")
    prepare([str(folder / "*")], out, options=OPTIONS, progress=False)
    c4 = get_task("c4_span_corruption")
    assert c4.source.num_examples("train", data_dir=out) == len(texts)
    examples = list(c4.get_dataset("train", {"inputs": 32, "targets": 8}, shuffle=True, seed=3, data_dir=out))
    assert examples and all(e["inputs"][-1] == 1 for e in examples)
    with pytest.raises(DataNotFoundError, match="prepared split 'train', not 'validation'"):
        list(c4.get_dataset("validation", data_dir=out))
    both = tmp_path / "both"  # one folder per split: data_dir/<split>/manifest.json
    prepare([str(folder / "c.txt")], str(both / "validation"), options=OPTIONS, split="validation", progress=False)
    os.rename(out, both / "train")
    assert c4.source.num_examples("train", data_dir=str(both)) == len(texts)
    validation = [d["text"] for d in c4.source.load("validation", data_dir=str(both))]
    assert validation == [texts[10] + "\n" + FOOTER]  # alone, the page keeps the footer
    out = str(both / "train")
    TaskRegistry.add("my_prepared_docs", source=PreparedSource(), preprocessors=[], output_features={})
    try:
        task = get_task("my_prepared_docs")
        assert sorted(d["text"] for d in task.get_dataset("train", shuffle=True, data_dir=out)) == sorted(texts)
        assert [d["text"] for d in task.get_dataset("train", shard_index=1, shard_count=2, data_dir=out)] == texts[1::2]
        with pytest.raises(DataNotFoundError, match="t5lite prepare"):
            list(task.get_dataset("train", data_dir=str(tmp_path)))
    finally:
        TaskRegistry.remove("my_prepared_docs")


def test_prepared_shards_are_a_random_access_source_for_grain(tmp_path):
    import pickle

    import grain
    folder, _, texts = crafted_corpus(tmp_path)
    prepare([str(folder / "*")], str(tmp_path / "out"), options=OPTIONS, progress=False)
    shards = pickle.loads(pickle.dumps(PreparedShards(str(tmp_path / "out"))))  # as a worker process gets it
    assert len(shards) == len(texts) and shards[-1]["text"] == texts[-1]
    assert [d["text"] for d in shards.__getitems__([11, 0, 6])] == [texts[11], texts[0], texts[6]]
    shuffled = [d["text"] for d in grain.MapDataset.source(shards).shuffle(seed=0)]
    assert sorted(shuffled) == sorted(texts) and shuffled != texts


def test_training_on_prepared_shards_reads_them_through_grain_and_resumes_exactly(tmp_path):
    """The loader reads prepared shards by index (O(1) resume), and a resumed loader continues with
    the batches an uninterrupted one yields."""
    from t5lite.data.loader import GrainExamples, Loader
    folder, _, _ = crafted_corpus(tmp_path)
    out = str(tmp_path / "out")
    prepare([str(folder / "*")], out, options=OPTIONS, progress=False)
    make = lambda: Loader(get_task("c4_span_corruption"), "train", {"inputs": 32, "targets": 8}, 4,  # noqa: E731
                          data_dir=out, block_size=4)
    loader = make()
    assert isinstance(loader.source, GrainExamples)
    batches = iter(loader)
    next(batches)
    state = loader.state()
    expected = [next(batches) for _ in range(2)]
    resumed = make()
    resumed.restore(state)
    again = iter(resumed)
    for want in expected:
        got = next(again)
        assert all((got[k] == want[k]).all() for k in want)


def test_an_input_changed_before_the_run_finished_is_prepared_again(tmp_path, monkeypatch, caplog):
    """A run stopped after shard 0 was written; then b.jsonl changes: the resumed run must not keep
    the old work, and ends as a fresh run of the changed inputs does (de-duplication spans files)."""
    from t5lite.data import prepare as prepare_module
    folder, _, _ = crafted_corpus(tmp_path)
    out = str(tmp_path / "out")
    filter_file = prepare_module.filter_file

    def stop_after_the_first_shard(job):
        if job.index > 0:
            raise KeyboardInterrupt
        return filter_file(job)
    monkeypatch.setattr(prepare_module, "filter_file", stop_after_the_first_shard)
    with pytest.raises(KeyboardInterrupt):
        prepare([str(folder / "*")], out, options=OPTIONS, progress=False, command="same")
    monkeypatch.undo()
    assert list(_manifest(out)["filtered"]) == ["0"]
    # b.jsonl now repeats a.jsonl's first page (its lines belong to a's page: a's shard loses nothing, b's
    # copy goes) and has a new page of its own.
    first_page = json.loads(gzip.open(folder / "a.jsonl.gz", "rt").readline())["text"]
    new_page = "\n".join(wikitext_sentences(200)[-4:])
    (folder / "b.jsonl").write_text(json.dumps({"text": first_page}) + "\n" + json.dumps({"text": new_page}) + "\n")
    with caplog.at_level("WARNING", logger="t5lite.prepare"):
        resumed = prepare([str(folder / "*")], out, options=OPTIONS, progress=False, command="same")
    assert any("b.jsonl changed since this preparation cleaned it" in r.getMessage() for r in caplog.records)
    fresh = prepare([str(folder / "*")], str(tmp_path / "fresh"), options=OPTIONS, progress=False, command="same")
    assert resumed == fresh
    assert list(PreparedShards(out)) == list(PreparedShards(str(tmp_path / "fresh")))
    assert new_page in [d["text"] for d in PreparedShards(out)]
    (folder / "c.txt").write_text("changed after the run finished")
    with pytest.raises(DataError, match=r"c\.txt changed after the preparation in --output .* finished"):
        prepare([str(folder / "*")], out, options=OPTIONS, progress=False, command="same")


@pytest.mark.parametrize("split", ["../../x", "a/b", "..", "", "/abs"])
def test_a_split_that_is_not_a_plain_name_is_refused_before_anything_is_written(tmp_path, capsys, split):
    (tmp_path / "in.txt").write_text("\n".join(wikitext_sentences(4)))
    (tmp_path / "deep" / "er").mkdir(parents=True)
    out = tmp_path / "deep" / "er" / "out"
    with pytest.raises(SystemExit) as e:
        cli.main(["prepare", "--input", str(tmp_path / "in.txt"), "--output", str(out), "--split", split,
                  "--no_language_filter"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"--split {split!r} is not a plain name" in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["deep", "er", "in.txt"]


def test_workers_are_capped_at_the_input_files_and_cpus(tmp_path, caplog, monkeypatch):
    """`--workers 999` once started 999 processes and 1998 sqlite files."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    (tmp_path / "in.txt").write_text("\n".join(wikitext_sentences(4)))
    with caplog.at_level("WARNING", logger="t5lite.prepare"):
        manifest = prepare([str(tmp_path / "in.txt")], str(tmp_path / "out"), workers=3, options=OPTIONS,
                           progress=False)
    assert [r.getMessage() for r in caplog.records] == ["--workers 3: using 1 (1 input file(s), 2 CPU(s))"]
    assert manifest["line_owner_buckets"] == 16 and manifest["counts"]["documents_kept"] == 1
