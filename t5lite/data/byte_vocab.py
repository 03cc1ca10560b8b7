"""ByT5's vocabulary: UTF-8 bytes, no training and no file.

Ids as seqio's `ByteVocabulary`: pad 0, EOS 1, UNK 2, byte b -> b + 3, then `extra_ids` sentinels
at the top (`<extra_id_0>` = vocab_size - 1). Decoding keeps only byte ids (specials and
sentinels vanish) and drops invalid UTF-8, as seqio does.
"""
from __future__ import annotations

from typing import Iterable

from t5lite.data.vocab import EOS_ID, PAD_ID, UNK_ID, Vocabulary, trimmed_span

NUM_SPECIAL = 3
SPECIAL_PIECES = {PAD_ID: "<pad>", EOS_ID: "</s>", UNK_ID: "<unk>"}


class ByteVocabulary(Vocabulary):
    """`path` must be None (bytes need no file); 125 extra ids by default, as ByT5."""

    def __init__(self, path: str | None = None, extra_ids: int = 125):
        if path is not None:
            raise ValueError(f"the bytes vocabulary has no file, got path={path!r}; set vocabulary.path = None")
        self.extra_ids = extra_ids

    def __repr__(self):
        return f"ByteVocabulary(extra_ids={self.extra_ids})"

    @property
    def vocab_size(self) -> int:
        return NUM_SPECIAL + 256 + self.extra_ids

    def encode(self, text: str) -> list[int]:
        return [b + NUM_SPECIAL for b in text.encode("utf-8")]

    def decode(self, ids: Iterable[int]) -> str:
        data = bytes(i - NUM_SPECIAL for i in self._clean(ids) if NUM_SPECIAL <= i < NUM_SPECIAL + 256)
        return data.decode("utf-8", errors="ignore")

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Every byte of a character spans that character (whitespace: an empty span, as for the other kinds)."""
        ids, spans = [], []
        for index, char in enumerate(text):
            encoded = self.encode(char)
            ids += encoded
            spans += [trimmed_span(text, index, index + 1)] * len(encoded)
        return ids, spans

    def id_to_piece(self, i: int) -> str:
        """Hugging Face's ByT5 names: the byte as a character, `<extra_id_N>` for sentinels."""
        i = int(i)
        if i in SPECIAL_PIECES:
            return SPECIAL_PIECES[i]
        if i < NUM_SPECIAL + 256:
            return chr(i - NUM_SPECIAL)
        return f"<extra_id_{self.vocab_size - 1 - i}>"
