"""Vision-language models: building, loading, the processor, the chat format, forward passes, FSDP2."""
