//! LoRA adapters in PEFT's format.
