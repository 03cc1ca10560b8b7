"""C4 cleaning (t5lite.data.c4) against TFDS's own functions (`tensorflow_datasets/text/c4_utils.py`:
`clean_page`, `normalize_url`, `is_valid_length`, `select_newest_page`, `_emit_url_to_lines` +
`_remove_lines_from_text`, `get_badwords_filter_fn`), run on the same random pages.

Two pieces of TFDS are replaced, both stated: its sentence splitter (NLTK punkt, which needs a
download) becomes t5lite's `count_sentences` on both sides, so the tests compare the line and page
rules, not the splitters; and the Apache Beam steps of `remove_duplicate_text` (beam is not
installed) are written out here: `Top.PerKey(1, key=_hash_text, reverse=True)` keeps, per line
hash, the URL with the smallest md5, and `CoGroupByKey` gives each page the line hashes it won;
Beam's metric counters are no-ops."""
import collections
import dataclasses
import re

import numpy as np
import pytest

from t5lite.data import c4

c4_utils = pytest.importorskip("tensorflow_datasets.text.c4_utils", reason="TFDS is the C4 reference")

GOOD = ["The committee met on Tuesday to discuss the budget.", "Is this the right way to the station?",
        "She said it was the best day of her life!", 'He called it "the finest hour of the war."',
        "Rain is expected over the weekend in most of the north.", "Prices rose sharply in March [1].",
        "The results were published in a journal [citation needed].", "The bridge was opened in 1932 [edit]."]
BAD_LINES = ["Click here", "Read more...", "Share this article on social media", "Home | About | Contact",
             "Please enable JavaScript to view the comments.", "By using this site you agree to our terms of use.",
             "This website uses cookies to improve your experience.", "A" * 1001 + " is a very long word here.",
             "Short line.", "", "   ", "Ends with a colon and has five words:"]
PAGE_KILLERS = ["Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
                "function f() { return the value of this call. }"]


def random_page(rng):
    lines = list(rng.choice(GOOD + BAD_LINES, size=int(rng.integers(1, 9))))
    if rng.random() < 0.15:
        lines.insert(int(rng.integers(0, len(lines) + 1)), str(rng.choice(PAGE_KILLERS)))
    return "\n".join(("  " + line + " ") if rng.random() < 0.2 else line for line in lines)


@pytest.fixture
def no_beam_counters(monkeypatch):
    monkeypatch.setattr(c4_utils, "get_counter_inc_fn", lambda namespace: lambda *args: None)


@pytest.fixture
def tfds_sentences(monkeypatch):
    """TFDS's `_get_sentences` counting as t5lite's `count_sentences` (punkt needs a download)."""
    monkeypatch.setattr(c4_utils, "_get_sentences", lambda text: [text] * c4.count_sentences(text))


def tfds_clean(text):
    clean = c4_utils.get_clean_page_fn()
    pages = list(clean(c4_utils.PageFeatures(text=text), counter_inc_fn=lambda *args: None))
    return pages[0].text if pages else None


@pytest.mark.parametrize("seed", range(4))
def test_clean_page_equals_tfdss(seed, tfds_sentences):
    rng = np.random.default_rng(seed)
    outcomes = collections.Counter()
    for _ in range(150):
        text = random_page(rng)
        expected = tfds_clean(text)
        assert c4.clean_page(text) == expected, text
        outcomes[expected is None] += 1
    assert outcomes[True] and outcomes[False]   # both kept and dropped pages were compared


def test_normalize_url_equals_tfdss():
    urls = ["https://www.example.com/a/", "http://example.com/a?utm_source=x", "https://example.com/a?ref=home",
            "https://example.com/a?id=3", "example.com/feed/?feed=rss", "http://www.www.example.com//", "ftp://x.org/"]
    assert [c4.normalize_url(u) for u in urls] == [c4_utils.normalize_url(u) for u in urls]


def tfds_dedupe(pages):
    """TFDS's `remove_duplicate_text` with its Beam steps written out (see the module docstring)."""
    winner = {}
    for page in pages:
        for line_hash, url in c4_utils._emit_url_to_lines(page):
            if line_hash not in winner or c4_utils._hash_text(url) < c4_utils._hash_text(winner[line_hash]):
                winner[line_hash] = url
    lines_by_url = collections.defaultdict(list)
    for line_hash, url in winner.items():
        lines_by_url[url].append(line_hash)
    out = []
    for page in pages:
        out += c4_utils._remove_lines_from_text((page.url, {"pages": [page], "lines": lines_by_url[page.url]}),
                                                counter_inc_fn=lambda *args: None,
                                                min_num_sentences=c4.MIN_NUM_SENTENCES)
    return [(p.url, p.text) for p in out]


@pytest.mark.parametrize("seed", range(4))
def test_line_deduplication_equals_tfdss(seed, tfds_sentences):
    rng = np.random.default_rng(seed)
    texts = [tfds_clean(random_page(rng)) for _ in range(60)]
    pages = [{"url": f"https://site{i}.example/p", "text": t} for i, t in enumerate(texts) if t is not None]
    ours = [(p["url"], p["text"]) for p in c4.dedupe_lines(pages)]
    theirs = tfds_dedupe([c4_utils.PageFeatures(url=p["url"], text=p["text"]) for p in pages])
    assert ours == theirs
    assert len(ours) < len(pages)   # the shared lines did remove pages


@pytest.mark.parametrize("seed", range(3))
def test_whole_filter_equals_tfdss_pipeline(seed, tfds_sentences, no_beam_counters):
    """TFDS's steps in its builder's order (c4.py): `is_valid_length`, `select_newest_page` per
    normalised URL, `clean_page`, line de-duplication, then the bad-word filter (language id left out)."""
    rng = np.random.default_rng(seed)
    pages = []
    for i in range(80):
        url = (f"http{rng.choice(['', 's'])}://{rng.choice(['www.', ''])}a{rng.integers(0, 40)}.org/x"
               f"{rng.choice(['', '/', '?utm_source=y'])}")
        last = f"Page {i} has darn words here." if rng.random() < 0.1 else f"This is page number {i} of the test."
        own = [f"Sentence {k} of page {i} belongs to this page alone." for k in range(int(rng.integers(0, 3)))]
        pages.append({"url": url, "timestamp": f"2019-0{rng.integers(1, 4)}",
                      "text": "\n".join([random_page(rng), *own, last])})
    pages.append({"url": "https://long.org", "text": "\n".join(GOOD) * 5000})   # over 1.9e5 characters
    features = [c4_utils.PageFeatures(url=p["url"], normalized_url=c4_utils.normalize_url(p["url"]), text=p["text"],
                                      timestamp=p.get("timestamp", ""), language="en") for p in pages]
    groups = collections.defaultdict(list)
    for page in filter(c4_utils.is_valid_length, features):
        groups[page.normalized_url].append(page)
    newest = [c4_utils.select_newest_page(group) for group in groups.values()]
    clean = c4_utils.get_clean_page_fn()
    cleaned = [q for p in newest for q in clean(p)]
    deduped = {url: text for url, text in tfds_dedupe(cleaned)}
    keep = c4_utils.get_badwords_filter_fn({"en": ["darn"]}, filter_fraction=1.0)
    theirs = sorted((p.url, deduped[p.url]) for p in cleaned
                    if p.url in deduped and keep(dataclasses.replace(p, text=deduped[p.url])))
    ours = sorted((p["url"], p["text"]) for p in c4.clean_pages(pages, badwords=["darn"]))
    assert ours == theirs
    assert 5 < len(ours) < len(groups)   # every step removed something


@pytest.mark.parametrize("seed", range(3))
def test_badword_filter_equals_tfdss(seed, no_beam_counters):
    words = ["darn", "heck", "two words", "a+b"]
    keep = c4_utils.get_badwords_filter_fn({"en": words}, filter_fraction=1.0)
    ours = c4.badword_filter(words)
    rng = np.random.default_rng(seed)
    vocabulary = ["Darn", "darned", "heck!", "(heck)", "two words", "two  words", "a+b", "xa+b", "the", "cat", "\n"]
    for _ in range(200):
        text = " ".join(rng.choice(vocabulary, size=int(rng.integers(1, 6))))
        page = c4_utils.PageFeatures(url="u", normalized_url="u", text=text, language="en")
        assert ours(text) == keep(page), repr(text)
    assert re.search("darn", "darned") and ours("darned")
