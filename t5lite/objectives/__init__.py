"""What a train step minimises: the `Objective` interface (base) and one module per family.

base: the interface and token cross entropy (span corruption, LM, MLM). causal_lm: GPT's causal
LM, evaluated by its held-out loss (heldout). encoder: BERT's MLM with
NSP, SOP or SpanBERT's SBO. electra: replaced-token detection. finetune: task heads
(classification, span extraction, tagging, GPT's auxiliary LM). distillation and
sequence_distillation: students of a frozen teacher. sentence, skip_thought, quick_thought:
sentence embeddings. recurrent: ELMo's biLM, ULMFiT's AWD-LSTM and recurrent classifiers.
word2vec: skip-gram and CBOW. losses and sentence_losses: the losses they share. families imports
every family so gin knows its names (`train.objective = @MlmNspObjective()`).
"""
from t5lite.objectives.base import LossConfig, Objective  # noqa: F401
