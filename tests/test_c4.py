"""C4 cleaning (t5lite.data.c4) on made-up pages, and the c4_span_corruption task under TFDS mock_data."""
import hashlib

import numpy as np
import pytest

from t5lite.data import c4, get_task

GOOD = ["The quick brown fox jumps over the lazy dog.",
        "Is this a question that has enough words?",
        "What a wonderful day it is for a walk!",
        'She said that it was "a fine idea indeed."']


def _page(*lines):
    return "\n".join(lines)


def test_keeps_good_lines_and_strips_them():
    assert c4.clean_page(_page(*(f"  {line}  " for line in GOOD))) == "\n".join(GOOD)


@pytest.mark.parametrize("bad_line", [
    "Too short to keep.",                                  # under 5 words
    "This line has no end mark at all",
    "This line trails off into nothing...",
    "This line has a " + "x" * 1001 + " very long word.",
    "Please enable JavaScript to view this site properly.",
    "By using this site you agree to our Terms of Use.",
    "We use cookies to improve your experience here.",
    "Read our privacy policy before you sign up today.",
])
def test_line_filters(bad_line):
    assert c4.clean_page(_page(GOOD[0], bad_line, *GOOD[1:])) == "\n".join(GOOD)


def test_citations_are_removed_before_the_end_mark_check():
    page = _page("Paris is the capital city of France.[1]", "Its river is called the Seine, they say.[edit]",
                 "Some claim that this is really true[citation needed].", "A line ending in a citation [12]")
    assert c4.clean_page(page) == ("Paris is the capital city of France.\nIts river is called the Seine, they say.\n"
                                   "Some claim that this is really true.")


@pytest.mark.parametrize("line", ["Lorem ipsum dolor sit amet, consectetur.", "function f() { return 1; } is code."])
def test_page_level_drops(line):
    assert c4.clean_page(_page(*GOOD, line)) is None


def test_javascript_line_with_brace_drops_only_the_line():
    assert c4.clean_page(_page(*GOOD, "Our javascript code uses { braces } a lot.")) == "\n".join(GOOD)


def test_too_few_sentences():
    assert c4.clean_page(_page(GOOD[0], GOOD[1])) is None
    assert c4.clean_page(_page(GOOD[0], "One. Two sentences here in this line.")) is not None
    assert c4.count_sentences("One. Two! Three? Four") == 3
    assert c4.count_sentences('He said "stop." Then left.') == 2
    assert c4.count_sentences("no end mark") == 1 and c4.count_sentences("  ") == 0


def test_dedupe_lines_keeps_each_line_in_one_page():
    shared = "This line appears on two different web pages."
    urls = ["http://a.example/x", "http://b.example/y"]
    owner, other = sorted(urls, key=lambda u: hashlib.md5(u.encode()).hexdigest())
    pages = [{"url": other, "text": _page(shared, *GOOD)},
             {"url": owner, "text": _page(*GOOD[:2], shared, shared.upper(), "Another sentence here is fine.")}]
    out = {p["url"]: p["text"] for p in c4.dedupe_lines(pages)}
    # GOOD[0], GOOD[1] and the shared line all belong to `owner`; `other` keeps GOOD[2:], 2 sentences: dropped.
    assert out == {owner: _page(*GOOD[:2], shared, "Another sentence here is fine.")}


def test_badword_filter_matches_whole_words():
    ok = c4.badword_filter(["darn", "heck"])
    assert ok("A classic day.") and ok("Darned socks.")
    assert not ok("Oh heck, what now.") and not ok("DARN") and not ok("(darn)")
    assert c4.badword_filter([])("anything darn")


def _unique(tag):
    """Three good lines no other page has (de-duplication would otherwise move shared lines)."""
    return [f"This is the first {tag} line with words.", f"Here comes the second {tag} line now!",
            f"Is this the third {tag} line of the page?"]


def test_clean_pages_pipeline():
    pages = [
        {"url": "https://www.site.example/a/", "text": _page(*_unique("old")), "timestamp": "2019-01-01"},
        {"url": "http://site.example/a?utm_source=x", "text": _page(*_unique("new"), "Too short."),
         "timestamp": "2019-05-01"},                               # same normalised URL, newer: wins
        {"url": "http://long.example", "text": _page(*_unique("long"), "word " * 40000)},  # over 1.9e5 characters
        {"url": "http://bad.example", "text": _page(*_unique("bad"), "Oh heck, this page has a bad word.")},
        {"url": "http://fr.example", "text": _page(*_unique("fr"), "Ceci est une phrase en bon français.")},
        {"url": "http://ok.example", "text": _page(*_unique("ok"))},
    ]
    out = list(c4.clean_pages(pages, badwords=["heck"], is_english=lambda text: "français" not in text))
    assert [p["url"] for p in out] == ["http://site.example/a?utm_source=x", "http://ok.example"]
    assert out[0]["text"] == _page(*_unique("new")) and out[0]["timestamp"] == "2019-05-01"
    assert c4.normalize_url("https://www.site.example/a/?ref=rss") == "site.example/a"


def test_langdetect_english():
    pytest.importorskip("langdetect", reason="language id needs the optional langdetect package")
    assert c4.langdetect_english(" ".join(GOOD * 3))
    assert not c4.langdetect_english("Ceci est une phrase en français, écrite pour le test de la langue.")


def test_c4_span_corruption_with_mock_data():
    tfds = pytest.importorskip("tensorflow_datasets", reason="the TFDS path needs tensorflow-datasets")
    task = get_task("c4_span_corruption")
    assert task.source.fallback.name == "c4/en"
    with tfds.testing.mock_data(num_examples=60, policy=tfds.testing.MockPolicy.USE_CODE):
        examples = list(task.get_dataset("train", sequence_length={"inputs": 32, "targets": 8}, shuffle=True, seed=1))
        again = list(task.get_dataset("train", sequence_length={"inputs": 32, "targets": 8}, shuffle=True, seed=1))
    assert examples and all(len(e["inputs"]) <= 32 and e["inputs"][-1] == 1 for e in examples)
    assert sum(len(e["inputs"]) < 32 for e in examples) == 1  # T5's short last piece of the 60 documents
    vocab_size = task.output_features["inputs"].vocabulary.vocab_size
    assert all(e["targets"][0] == vocab_size - 1 for e in examples)  # <extra_id_0> opens the targets
    assert all(np.array_equal(a["inputs"], b["inputs"]) for a, b in zip(examples, again))
