"""Every objective family, imported so gin knows their names (`train.objective = @...()`).

The names are gin's short ones (`ElectraObjective`), which every shipped config and every run's
operative `config.gin` use, so they do not depend on the module an objective lives in.
"""
from t5lite.objectives import (causal_lm, distillation, electra, encoder, finetune, image_classification,  # noqa: F401
                               image_to_text, quick_thought, recurrent, sentence, skip_thought, word2vec)
