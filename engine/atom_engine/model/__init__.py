"""The torch model, its loader and tokenizers."""
