"""Serve app settings: defaults, `serve run serve_app:app key=value` arguments, config-file args."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from settings.load import typed_settings
from storage.adapters import check_name


@dataclass
class ServeSettings:
    base_model: str = "assets/maze-vl-base"     # local folder, s3://bucket/prefix or Hugging Face id
    base_id: str = ""                            # the model id clients use; default: the folder's name
    dynamic_lora_loading_path: str = "runs/default/exports"  # local folder or s3:// prefix
    max_loras: int = 4                           # adapters resident per replica (LRU)
    max_lora_rank: int = 64
    max_model_len: int = 4096                    # prompt + completion tokens
    max_tokens: int = 512                        # the largest max_tokens a request may ask for
    num_replicas: int = 1
    min_replicas: int = 0                        # with max_replicas > min_replicas: autoscaling
    max_replicas: int = 0
    prewarm: str = ""                            # comma-separated adapter names loaded at replica start
    backend: str = "hf"                          # hf | vllm (ray.serve.llm; CPU build in .venv-vllm)
    device: str = "auto"
    max_batch_size: int = 16
    batch_wait_timeout_s: float = 0.01
    max_body_bytes: int = 8 * 1024 * 1024
    max_image_pixels: int = 1024 * 1024
    cache_dir: str = ""                          # adapter download cache; default ~/.cache/visrl/adapters
    s3_endpoint_url: str = ""                    # S3-compatible store (MinIO, moto); AWS_ENDPOINT_URL works too
    num_cpus: float = 1.0
    speedups: bool = True                        # visrl's speed-ups of transformers' model code (trainer.policy.model.speedups)
    num_gpus: float = 0.0                        # per hf replica; 0: one where it runs on a GPU (serve_app.replica_gpus)

    @classmethod
    def from_args(cls, args: dict) -> "ServeSettings":
        s = typed_settings(cls, args, "serve argument")
        if s.backend not in ("hf", "vllm"):
            raise ValueError(f"serve argument 'backend' must be hf or vllm, got '{s.backend}'")
        if s.max_loras < 1 or s.num_replicas < 1:
            raise ValueError("max_loras and num_replicas must be >= 1")
        if s.num_gpus < 0 or s.num_cpus <= 0:
            raise ValueError(f"num_gpus must be >= 0 and num_cpus > 0; got num_gpus={s.num_gpus}, num_cpus={s.num_cpus}")
        if not s.base_id:
            s.base_id = Path(s.base_model.rstrip("/")).name
        s.prewarm_names()  # a bad name stops the app before a replica starts
        return s

    def prewarm_names(self) -> list[str]:
        """The adapters loaded at replica start, at most max_loras of them (the rest would evict them)."""
        names = [n.strip() for n in self.prewarm.split(",") if n.strip()]
        if len(names) > self.max_loras:
            raise ValueError(f"serve argument 'prewarm' names {len(names)} adapters but max_loras={self.max_loras} "
                             "can hold only that many; name fewer or raise max_loras")
        return [check_name(n, "serve argument 'prewarm'") for n in names]
