"""Generation backends behind the VLLMEngine actor: `hf` (transformers, CPU or GPU) and `vllm`."""
