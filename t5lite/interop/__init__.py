"""Interoperability with other ecosystems: Hugging Face checkpoints (`hf`), sentence embeddings."""
