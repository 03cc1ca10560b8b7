"""C4's cleaning rules, as TFDS's `c4` builder applies them, over pages `{"url", "text", ...}`.

In TFDS's order: drop pages over 1.9e5 characters; keep the newest page per normalised URL; clean
each page line by line (`clean_page`); de-duplicate lines across the corpus, each line kept by one
URL only; keep English pages (language id "en" with probability >= 0.99); drop pages with a bad word.
The paper's "three-sentence span" de-duplication is, in the code, this line-level one.

Sentence counts use a small deterministic splitter (TFDS uses NLTK's punkt model, which needs a
download); pass `count_sentences=` to use another. Language id needs a function (`langdetect_english`
wraps the `langdetect` package TFDS uses) and the bad-word list is supplied by the caller (C4 used the
LDNOOBW English list), so nothing is downloaded here.
"""
from __future__ import annotations

import hashlib
import re
from collections import Counter
from typing import Callable, Iterable, Iterator, Mapping

Page = Mapping[str, str]

MIN_WORDS_PER_LINE = 5
MIN_NUM_SENTENCES = 3
MAX_WORD_LENGTH = 1000
MAX_PAGE_LENGTH = 1.9e5
END_MARKS = (".", "?", "!", '"')
POLICY_SUBSTRINGS = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies",
                     "use cookies")
CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]")
_SENTENCE_END = re.compile(r"[.?!]+[\"')\]]*(?=\s|$)")


def count_sentences(text: str) -> int:
    """Sentences in `text`: runs of . ? ! (with closing quotes or brackets) before a space or the end.

    A stand-in for NLTK punkt: a non-empty text counts at least one sentence, as punkt does.
    """
    return max(len(_SENTENCE_END.findall(text)), 1) if text.strip() else 0


def clean_page(text: str, count_sentences: Callable[[str], int] = count_sentences,
               min_words_per_line: int = MIN_WORDS_PER_LINE, min_num_sentences: int = MIN_NUM_SENTENCES,
               max_word_length: int = MAX_WORD_LENGTH, counts: Counter | None = None) -> str | None:
    """The page's text with C4's line filters applied, or None when the whole page goes.

    Per stripped line, in TFDS's order: drop it if a word is over `max_word_length` characters;
    remove citation markers ([1], [edit], [citation needed]); drop it unless it ends in . ? ! or "
    (but not "..."), or if it has under `min_words_per_line` words; drop the page on "lorem ipsum";
    drop lines mentioning javascript; drop the page on "{"; drop lines with a policy phrase. The page
    goes if the kept lines hold under `min_num_sentences` sentences.

    `counts`, if given, is incremented by the filter that decided: one `page_*` reason for a dropped
    page, or, for a kept page, the non-blank lines each `line_*` filter removed from it.
    """
    kept, sentences, removed = [], 0, Counter()
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if any(len(word) > max_word_length for word in line.split()):
            removed["line_long_word"] += 1
            continue
        line = CITATION.sub("", line)
        if not line.endswith(END_MARKS) or line.endswith("..."):
            removed["line_no_end_mark"] += 1
            continue
        if len(line.split()) < min_words_per_line:
            removed["line_too_few_words"] += 1
            continue
        lower = line.lower()
        if "lorem ipsum" in lower:
            return _dropped(counts, "page_lorem_ipsum")
        if "javascript" in lower:  # checked before "{", so a javascript line with a brace drops only itself
            removed["line_javascript"] += 1
            continue
        if "{" in line:
            return _dropped(counts, "page_curly_brace")
        if any(p in lower for p in POLICY_SUBSTRINGS):
            removed["line_policy"] += 1
            continue
        sentences += count_sentences(line)
        kept.append(line)
    if sentences < min_num_sentences:
        return _dropped(counts, "page_too_few_sentences")
    if counts is not None:
        counts.update(removed)
    return "\n".join(kept).strip()


def _dropped(counts: Counter | None, reason: str) -> None:
    if counts is not None:
        counts[reason] += 1
    return None


def normalize_url(url: str) -> str:
    """The URL without scheme, "www.", tracking query (utm_/ref/feed) or trailing slash."""
    url = re.sub(r"https?://(www\.)?", "", url)
    url = re.sub(r"\?(utm_|ref|feed).*", "", url)
    return url.rstrip("/")


def md5(text: str) -> bytes:
    return hashlib.md5(text.encode("utf-8")).digest()


def line_key(line: str) -> bytes:
    """What de-duplication compares: the md5 of the stripped, lower-cased line (as TFDS hashes it)."""
    return md5(line.strip().lower())


def keep_owned_lines(text: str, page_key, owner: Mapping[bytes, object]) -> str:
    """The page's lines that it owns (`owner[line_key] == page_key`), each only at its first copy."""
    seen, kept = set(), []
    for line in text.split("\n"):
        key = line_key(line)
        if owner[key] == page_key and key not in seen:
            seen.add(key)
            kept.append(line)
    return "\n".join(kept)


def dedupe_lines(pages: Iterable[Page], count_sentences: Callable[[str], int] = count_sentences,
                 min_num_sentences: int = MIN_NUM_SENTENCES) -> Iterator[dict]:
    """Keeps each line (compared stripped and lower-cased) in one page only, then re-checks sentences.

    As TFDS: the page whose URL has the smallest md5 keeps a line, a page keeps only the first copy
    of a line it repeats, and a page left empty or under `min_num_sentences` sentences goes.
    """
    pages = list(pages)
    owner: dict[bytes, bytes] = {}
    for page in pages:
        url_key = md5(page["url"])
        for line in page["text"].split("\n"):
            key = line_key(line)
            if key not in owner or url_key < owner[key]:
                owner[key] = url_key
    for page in pages:
        text = keep_owned_lines(page["text"], md5(page["url"]), owner)
        if enough_sentences(text, count_sentences, min_num_sentences):
            yield {**page, "text": text}


def enough_sentences(text: str, count_sentences: Callable[[str], int] = count_sentences,
                     min_num_sentences: int = MIN_NUM_SENTENCES) -> bool:
    """Whether a de-duplicated page stays: not empty, and at least `min_num_sentences` sentences."""
    return bool(text) and (not min_num_sentences or count_sentences(text) >= min_num_sentences)


def badword_filter(badwords: Iterable[str]) -> Callable[[str], bool]:
    """A predicate "text has none of the bad words", each matched in the lower-cased text as a whole word."""
    words = sorted({w.strip().lower() for w in badwords if w.strip()})
    if not words:
        return lambda text: True
    pattern = re.compile(r"(?:\W|^)({})(?:\W|$)".format("|".join(map(re.escape, words))))
    return lambda text: pattern.search(text.lower()) is None


def langdetect_english(text: str, min_probability: float = 0.99) -> bool:
    """TFDS's language filter: `langdetect` (seeded for determinism) says "en" with >= min_probability."""
    import langdetect  # optional dependency, as in TFDS

    langdetect.DetectorFactory.seed = 0
    try:
        best = langdetect.detect_langs(text)[0]
    except (langdetect.lang_detect_exception.LangDetectException, IndexError):
        return False
    return best.lang == "en" and best.prob >= min_probability


def clean_pages(pages: Iterable[Page], badwords: Iterable[str] = (),
                is_english: Callable[[str], bool] | None = None,
                count_sentences: Callable[[str], int] = count_sentences,
                max_page_length: float = MAX_PAGE_LENGTH) -> Iterator[dict]:
    """The whole C4 filter over an iterable of pages (`url`, `text`, optional `timestamp`).

    Materialises the pages, since both URL selection and line de-duplication look at all of them.
    `is_english=None` skips language id (e.g. for text known to be English).
    """
    newest: dict[str, Page] = {}
    for page in pages:
        if len(page["text"]) > max_page_length:
            continue
        url = normalize_url(page["url"])
        if url not in newest or page.get("timestamp", "") > newest[url].get("timestamp", ""):
            newest[url] = page
    cleaned = []
    for page in newest.values():
        text = clean_page(page["text"], count_sentences)
        if text is not None:
            cleaned.append({**page, "text": text})
    no_badwords = badword_filter(badwords)
    for page in dedupe_lines(cleaned, count_sentences):
        if (is_english is None or is_english(page["text"])) and no_badwords(page["text"]):
            yield page
