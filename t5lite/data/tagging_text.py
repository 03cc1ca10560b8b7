"""Tags as text, so a text-to-text model (T5, BART) tags words the T5 way and is scored by the
same entity F1 and token accuracy as a tagging head.

- Entities (BIO tags): the target lists the sentence's entities in order as
  `TYPE: span; TYPE: span` ("PER: John Smith; LOC: Paris"), empty when there are none; the
  entities are conlleval's chunks (`t5lite.metrics.entities`, so an I- after O starts one).
  Reading a decoded text back puts each `TYPE: span` on the first free place of the sentence
  where its words occur, searching after the previous entity first (B-TYPE on its first word,
  I-TYPE on the rest); a part that is no `TYPE: span` of a known type, or whose words are not
  in the sentence, is dropped.
- Per-word tags (POS): the target is the tags in word order, "PRON VERB DET NOUN"; read back,
  a missing tag is `MISSING` (never a gold tag, so it counts as wrong) and extra ones are cut.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

from t5lite import metrics
from t5lite.data.registry import Example

ENTITY_SEPARATOR = "; "
TYPE_SEPARATOR = ": "
MISSING = "_"


def _words(text: str) -> str:
    """Whitespace-normalised text, so spans compare word by word."""
    return " ".join(text.split())


def entities_text(words: Sequence[str], tags: Sequence[str]) -> str:
    """BIO tags -> "TYPE: span; TYPE: span" in sentence order ("" without entities)."""
    return ENTITY_SEPARATOR.join(f"{type_}{TYPE_SEPARATOR}{_words(' '.join(words[first:last + 1]))}"
                                 for type_, first, last in metrics.entities(tags))


def parse_entities(text: str, types: Iterable[str]) -> list[tuple[str, str]]:
    """"TYPE: span; ..." -> [(TYPE, span)], keeping only the parts of a type in `types`."""
    known, out = set(types), []
    for part in text.split(ENTITY_SEPARATOR.strip()):
        type_, sep, span = part.partition(TYPE_SEPARATOR.strip())
        if sep and type_.strip() in known and _words(span):
            out.append((type_.strip(), _words(span)))
    return out


def _find(words: Sequence[str], span: str, free: Sequence[bool], start: int) -> tuple[int, int] | None:
    """The first [i, j) at or after `start` whose words, all still free, read `span`."""
    for i in range(start, len(words)):
        for j in range(i + 1, len(words) + 1):
            if not free[j - 1]:
                break
            text = _words(" ".join(words[i:j]))
            if text == span:
                return i, j
            if len(text) >= len(span):
                break
    return None


def entity_tags(words: Sequence[str], text: str, types: Iterable[str]) -> list[str]:
    """A decoded "TYPE: span; ..." -> one BIO tag per word (see the module docstring)."""
    tags, free, cursor = ["O"] * len(words), [True] * len(words), 0
    for type_, span in parse_entities(text, types):
        found = _find(words, span, free, cursor) or _find(words, span, free, 0)
        if found is None:
            continue
        i, j = found
        tags[i:j] = [f"B-{type_}"] + [f"I-{type_}"] * (j - i - 1)
        free[i:j] = [False] * (j - i)
        cursor = j
    return tags


def sequence_tags(words: Sequence[str], text: str) -> list[str]:
    """A decoded "TAG TAG ..." -> one tag per word (MISSING where the text is short)."""
    tags = text.split()[:len(words)]
    return tags + [MISSING] * (len(words) - len(tags))


def tagging_text(dataset: Iterable[Example], prefix: str, entities: bool) -> Iterator[Example]:
    """Sentences `{"id", "words", "tags"}` -> `inputs` "<prefix>: w1 w2 ...", `targets` the tags as
    text (entities or one tag per word), keeping `id`, `words` and `tags` for the postprocessor."""
    for ex in dataset:
        target = entities_text(ex["words"], ex["tags"]) if entities else " ".join(ex["tags"])
        yield {"inputs": f"{prefix}{TYPE_SEPARATOR}{_words(' '.join(ex['words']))}", "targets": target,
               "id": ex["id"], "words": list(ex["words"]), "tags": list(ex["tags"])}


def text_to_tags(text: str, example: Example, is_target: bool, types: Sequence[str] | None) -> list[str]:
    """Postprocessor: a target is the sentence's own gold tags (whatever was trimmed from its text);
    a prediction is read back per word, as entities of `types`, or as a tag sequence (None)."""
    if is_target:
        return list(example["tags"])
    if types is None:
        return sequence_tags(example["words"], text)
    return entity_tags(example["words"], text, types)
