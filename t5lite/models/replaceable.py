"""Frozen config dataclasses that say which field a misspelt `replace` (or gin override) meant."""
from __future__ import annotations

import dataclasses
import difflib

from t5lite.errors import ConfigError


class Replaceable:
    """`config.replace(**changes)` for a frozen dataclass, with a one-line error naming a misspelt field."""

    def replace(self, **changes):
        fields = [f.name for f in dataclasses.fields(self)]
        for name in changes:
            if name not in fields:
                close = difflib.get_close_matches(name, fields, n=3)
                hint = f"did you mean {', '.join(close)}?" if close else f"the fields are {', '.join(fields)}"
                raise ConfigError(f"model config has no field {name!r}; {hint}")
        return dataclasses.replace(self, **changes)
