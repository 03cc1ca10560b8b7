"""Pre-training objectives as preprocessors over tokenized examples, one module per family.

denoise: T5's objective table (noise mask x inputs function x targets function), prefix LM,
causal LM. masking: BERT's masked LM (whole words, static or dynamic) and SpanBERT's span
masking. bart_noise: BART's composable noising. sentence_pairs: NSP, SOP and RoBERTa's
FULL-/DOC-SENTENCES packing. Every random choice is drawn from `np.random.default_rng` seeded by
the preprocessor's `seed` and the example's index, so a stream is a pure function of its seed.
"""
