"""`t5lite prepare` on real text made web-like: per-filter counts and documents/s per worker.

Builds a raw crawl from the shared data (CNN/DailyMail articles and WikiText articles, as pages
with URLs) with boilerplate generated here: cookie notices, javascript lines, navigation menus,
short "share" lines, a footer every page of a site repeats, lorem-ipsum and code pages, syndicated
copies of articles under a second URL, German pages (WMT news) and made-up bad words. Then runs
`t5lite prepare` with 1 and 2 workers into fresh folders and prints the manifest's counts and the
throughput (wall and CPU: the machine may be shared), with and without the language filter
(langdetect takes most of the time), and the peak memory of the line-owner store as lines grow.
    python benchmarks/prepare_corpus.py [--raw /tmp/t5lite_raw_web] [--out /tmp/t5lite_prepared]
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("T5LITE_SHARED_DATA", REPO.parent / "shared" / "data"))
FILES = 8
BAD_WORDS = ["blorptastic", "snarfwidget"]  # made up: the real lists are not copied here

COOKIES = ["This site uses cookies to improve your experience and to show you relevant adverts.",
           "By continuing to browse you agree to our use of cookies and our privacy policy.",
           "We use cookies on this website; read our cookie policy to find out more."]
JAVASCRIPT = ["You need to enable JavaScript to watch this video in your browser.",
              "Please turn on javascript to see the comments on this article."]
NAV = "Home | World | Politics | Business | Health | Entertainment | Travel"
SHORT = ["Share this story.", "Advertisement.", "Read more.", "Related articles"]
FOOTERS = {"news.example": "All stories on this site are provided for general information only, without warranty.",
           "wiki.example": "Text is available under the terms shown on the about page of this site, as always."}
LOREM = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt."
CODE = "Add the widget with var widget = { id: 7, autoplay: true }; to your page."


def cnn_pages() -> list[tuple[str, list[str]]]:
    """(url, paragraphs): each article cut after every second sentence."""
    csv.field_size_limit(1 << 30)
    with open(DATA / "summarization" / "cnn_dailymail" / "cnn_dailymail_validation_subset.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    pages = []
    for row in rows:
        sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z\"'])", row["article"])
        pages.append((f"https://news.example/{row['id']}", [" ".join(sentences[i:i + 2])
                                                            for i in range(0, len(sentences), 2)]))
    return pages


def wikitext_pages() -> list[tuple[str, list[str]]]:
    """(url, lines): WikiText articles (split at their " = Title = " lines), headings kept as lines."""
    pages = []
    for name in ("valid.txt", "test.txt"):
        title, lines = None, []
        for line in (DATA / "text" / "wikitext-2" / name).read_text(encoding="utf-8").splitlines():
            heading = re.fullmatch(r" = ([^=].*) = ", line)
            if heading:
                if title:
                    pages.append((f"https://wiki.example/{title.replace(' ', '_')}", lines))
                title, lines = heading.group(1), []
            elif line.strip():
                lines.append(line.strip())
        if title:
            pages.append((f"https://wiki.example/{title.replace(' ', '_')}", lines))
    return pages


def german_pages(count: int) -> list[tuple[str, list[str]]]:
    lines = (DATA / "wmt" / "de-en" / "newstest2014-deen.de").read_text(encoding="utf-8").splitlines()
    return [(f"https://nachrichten.example/{i}", lines[10 * i:10 * i + 10]) for i in range(count)]


def web_like(pages, rng) -> list[dict]:
    """Pages with boilerplate injected, plus syndicated copies, short pages and bad-word pages."""
    out = []
    for url, lines in pages:
        site = url.split("/")[2]
        page = [NAV] + list(lines)
        if rng.random() < 0.5:
            page.insert(1, COOKIES[rng.integers(len(COOKIES))])
        if rng.random() < 0.3:
            page.insert(int(rng.integers(1, len(page))), JAVASCRIPT[rng.integers(len(JAVASCRIPT))])
        if rng.random() < 0.4:
            page.insert(int(rng.integers(1, len(page))), SHORT[rng.integers(len(SHORT))])
        if site in FOOTERS:
            page.append(FOOTERS[site])
        roll = rng.random()
        if roll < 0.03:
            page.insert(len(page) // 2, LOREM)
        elif roll < 0.06:
            page.insert(len(page) // 2, CODE)
        elif roll < 0.08:
            page.insert(len(page) // 2, f"Some readers of {url} said it was {BAD_WORDS[rng.integers(2)]} indeed.")
        out.append({"url": url, "text": "\n".join(page)})
        if rng.random() < 0.05:  # syndicated: the same article on another site
            out.append({"url": url.replace("https://", "https://mirror-"), "text": "\n".join([NAV] + list(lines))})
        if rng.random() < 0.02:  # a stub page
            out.append({"url": url + "/stub", "text": "\n".join([NAV] + list(lines[:1]))})
    return out


def build_raw(folder: Path) -> int:
    rng = np.random.default_rng(0)
    pages = web_like(cnn_pages() + wikitext_pages() + german_pages(30), rng)
    order = rng.permutation(len(pages))
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(FILES):
        with gzip.open(folder / f"crawl-{f:05d}.jsonl.gz", "wt", encoding="utf-8") as out:
            out.writelines(json.dumps(pages[i], ensure_ascii=False) + "\n" for i in order[f::FILES])
    (folder.parent / f"{folder.name}_bad_words.txt").write_text("\n".join(BAD_WORDS) + "\n")
    return len(pages)


def run_prepare(raw: Path, out: Path, workers: int, language_filter: bool) -> tuple[dict, float, float]:
    """(manifest, wall seconds, CPU seconds of the command and its workers)."""
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "t5lite.cli", "prepare", "--input", str(raw / "*.jsonl.gz"), "--output", str(out),
               "--workers", str(workers), "--bad_words", str(raw.parent / f"{raw.name}_bad_words.txt"),
               *([] if language_filter else ["--no_language_filter"])]
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return json.loads((out / "manifest.json").read_text()), seconds, cpu


STORE_POINT = """
import os, resource, sys, tempfile
from t5lite.data.prepare import LineOwners
lines = int(sys.argv[1])
with tempfile.TemporaryDirectory() as folder:
    store = LineOwners(folder, 16)
    store.create()
    for start in range(0, lines, 100_000):
        store.add({{os.urandom(16): os.urandom(24) for _ in range(min(100_000, lines - start))}})
    store.close()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def store_peak_mib(lines: int) -> int:
    result = subprocess.run([sys.executable, "-c", STORE_POINT.format(), str(lines)], cwd=REPO, check=True,
                            capture_output=True, text=True)
    return int(result.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--raw", default="/tmp/t5lite_raw_web")
    parser.add_argument("--out", default="/tmp/t5lite_prepared")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--store_lines", default="100000,1000000,3000000")
    args = parser.parse_args()
    raw = Path(args.raw)
    if not raw.exists():
        print(f"built {build_raw(raw)} raw pages in {raw}")
    rows = []
    for language_filter in (True, False):
        for workers in map(int, args.workers.split(",")):
            out = Path(f"{args.out}{'' if language_filter else '_nolangid'}_w{workers}")
            rows.append((language_filter, workers, *run_prepare(raw, out, workers, language_filter)))
    print("\n| count | language filter on | off |\n|---|---|---|")
    by_filter = {lang: manifest["counts"] for lang, _, manifest, _, _ in rows}
    for key in by_filter[True]:
        print(f"| {key} | {by_filter[True][key]} | {by_filter[False][key]} |")
    print("\n| language filter | workers | wall s | documents/s | documents/s per worker | documents per CPU-s |\n"
          "|---|---|---|---|---|---|")
    for language_filter, workers, manifest, seconds, cpu in rows:
        assert manifest["counts"] == by_filter[language_filter], "the counts differ between worker counts"
        rate = manifest["counts"]["documents_in"] / seconds
        print(f"| {'on' if language_filter else 'off'} | {workers} | {seconds:.1f} | {rate:.1f} | {rate / workers:.1f} "
              f"| {manifest['counts']['documents_in'] / cpu:.1f} |")
    print("\n| lines in the line-owner store | peak RSS MiB |\n|---|---|")
    for lines in map(int, args.store_lines.split(",")):
        print(f"| {lines} | {store_peak_mib(lines)} |")


if __name__ == "__main__":
    main()
