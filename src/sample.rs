//! Batched KV-cache sampling of G completions per prompt.
