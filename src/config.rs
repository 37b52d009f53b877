//! The TOML run configuration: schema (unknown keys rejected with key and line),
//! validation and `--set section.key=value` overrides.
