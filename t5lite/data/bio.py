"""IOB2 (BIO) tag checks for tagging files. A tag sequence that breaks the scheme still scores
(conlleval and seqeval read an I- without its B- as an entity's start), but it usually means a
damaged or mis-converted file, so the readers warn once per file, naming the line."""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Iterator, Sequence

log = logging.getLogger("t5lite")
_warned: set[str] = set()   # files already warned about in this process


def first_error(tags: Sequence[str]) -> str | None:
    """What first breaks IOB2 in a sentence's tags ("word 3: I-LOC after O"), None if nothing does."""
    previous = "O"
    for i, tag in enumerate(tags, 1):
        if tag != "O" and tag[:2] not in ("B-", "I-"):
            return f"word {i}: {tag!r} is not O, B-TYPE or I-TYPE"
        if tag.startswith("I-") and previous[2:] != tag[2:]:
            return f"word {i}: {tag} after {previous}"
        previous = tag
    return None


def warn_once(path: str, line: int, tags: Sequence[str]) -> None:
    """Logs the first IOB2 break of `path` (a sentence starting at `line`), once per file."""
    error = None if path in _warned else first_error(tags)
    if error:
        _warned.add(path)
        log.warning("%s: sentence at line %d, %s; conlleval and seqeval count such an I- as the start of an "
                    "entity. Fix the tags (IOB2: B-TYPE starts an entity, I-TYPE continues it); this file may "
                    "break the scheme elsewhere too", path, line, error)


@dataclasses.dataclass(frozen=True)
class Checked:
    """A column reader (t5lite.data.sources.Conll) whose rows pass unchanged, their tags checked
    against IOB2 (`warn_once`)."""
    reader: Callable[[str], Iterator]

    def __call__(self, path: str) -> Iterator:
        for line, row in self.reader(path):
            if isinstance(row, dict):
                warn_once(path, line, row["tags"])
            yield line, row
