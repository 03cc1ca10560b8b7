"""The config and presets of word2vec's tables (t5lite.models.static): like `ModelConfig` where the
trainer needs it (a named preset from `t5lite.models.get_config`, `replace`, an `arch`)."""
from __future__ import annotations

import dataclasses

from t5lite.models.replaceable import Replaceable


@dataclasses.dataclass(frozen=True)
class Word2VecConfig(Replaceable):
    """The tables' shape: `dim`-wide vectors for `vocab_size` ids (the pad id 0 included). The
    vocabulary's size depends on the corpus and its min_count, so 0 means "the run's word2vec
    vocabulary's size", filled in when training starts (t5lite.objectives.word2vec); the run's
    `model_config.json` records the real one."""
    dim: int = 100
    vocab_size: int = 0
    dtype: str = "float32"
    arch: str = dataclasses.field(default="word2vec", init=False)


STATIC_PRESETS = {
    "word2vec": lambda: Word2VecConfig(),               # word2vec.c's default size
    "word2vec_300": lambda: Word2VecConfig(dim=300),    # the released GoogleNews vectors' size
}
