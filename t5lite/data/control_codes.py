"""Control codes for conditional generation (CTRL, Keskar et al. 2019; Ficler & Goldberg 2017's
style conditioning): each training text is prefixed by a code naming its class, so that a
prompt starting with a chosen code asks for text of that class.

- `control_code_text`: a labelled example -> `inputs` (its label's code, e.g. "positive") and
  `targets` (a space, then the text: the code and the text tokenize as the prompt "positive ..."
  does, so `t5lite infer` feeds the model what it was trained on).
- `ControlLMFeatureConverter` ("control_lm"): `inputs + targets` as one causal sequence fed as
  given, as CTRL's training data and `t5lite infer`'s prompts are (no start token): each token
  predicts the next one of its example, and the loss covers the text only, not the code (CTRL
  never predicts its code either: it is the first input, never an output). Packs like the other
  LM converters (segment ids, positions restarting at each code).
"""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

from t5lite.data.converters import PrefixLMFeatureConverter
from t5lite.data.gpt_inputs import order_features
from t5lite.data.registry import Example


def control_code_text(dataset: Iterable[Example], codes: Sequence[str], text_key: str = "sentence") -> Iterator[Example]:
    """{"inputs": codes[label], "targets": " " + text, "label"}; unlabelled rows (label -1, a test
    split) have no code and are left out."""
    for ex in dataset:
        label = int(ex["label"])
        if label < 0:
            continue
        yield {"inputs": codes[label], "targets": " " + ex[text_key].strip(), "label": label}


class ControlLMFeatureConverter(PrefixLMFeatureConverter):
    """A code (`inputs`) and its text (`targets`) as one causal sequence fed as given, the loss on
    the text: `decoder_input_tokens` are the tokens themselves, `decoder_target_tokens` the next
    token of the same example (an example's last token, its EOS, predicts nothing), weighted 1 where
    that next token is a `targets` token. The rows are the prefix LM's (each feature trimmed to its
    own length, then joined), without its start token and its bidirectional prefix."""
    name = "control_lm"
    FEATURES = {"decoder_target_tokens": "targets", "decoder_input_tokens": "targets",
                "decoder_loss_weights": "targets"}

    def _features(self, row, packed):
        features = order_features(row["targets"], row["targets_segment_ids"])
        del features["decoder_segment_ids"]   # packed rows get them with the positions
        predicts_text = row["targets_positions"] + 1 >= row["inputs_width"]
        features["decoder_loss_weights"] = features["decoder_loss_weights"] * predicts_text
        return features
