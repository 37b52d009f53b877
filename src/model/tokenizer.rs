//! Tokenizer and chat template.
