"""Where a PEFT LoRA adapter's files sit in a store: a folder that holds them, or a training run's
export (`global_step_N/`, whose `policy/` holds them). One rule for `--adapter`, the serve app and
its adapter registry."""
from __future__ import annotations

from storage.store import join

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
LAYOUTS = ("", "policy")  # the adapter folder itself, or a run export's policy/


def adapter_prefix(store, key: str = "") -> str | None:
    """The key under `store` (`key`, or `key`/policy) that holds both adapter files; None if neither does."""
    for layout in LAYOUTS:
        prefix = join(key, layout)
        if all(store.exists(join(prefix, f)) for f in ADAPTER_FILES):
            return prefix
    return None
