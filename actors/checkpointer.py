"""Checkpointer: saves and restores full training state to a local folder or s3://bucket/prefix.

Layout (docs/design.md, "Checkpoints"):
    {ckpt_path}/global_step_N/trainer_state.json     step, epoch, dataloader position, config, RNG
    {ckpt_path}/global_step_N/policy/adapter_model.safetensors + adapter_config.json
    {ckpt_path}/global_step_N/policy/optimizer.pt     optimizer + scheduler (torch.save, tensors only)
    {ckpt_path}/global_step_N/rollout_policy/         one-step-off: the older adapter the batch in flight
                                                      is sampled with (when it is not the policy's)
    {ckpt_path}/global_step_N/manifest.json           sha256 of every file above (written last in the folder)
    {ckpt_path}/latest_ckpt_global_step.txt           the commit marker, written after everything else

A checkpoint counts only once its manifest's checksums match. The marker says which one is the
latest; it is a hint: a missing, corrupt or partial checkpoint, or an empty or garbled marker, is
skipped (with a note naming it) in favour of the newest older checkpoint that verifies.
Loading never unpickles: safetensors for weights, torch.load(weights_only=True) for the rest.
"""
from __future__ import annotations

import hashlib
import io
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

from storage import StorageError, open_store
from storage.atomic import replace_dir, temp_beside

MARKER = "latest_ckpt_global_step.txt"
ROLLOUT_ADAPTER = "rollout_policy"
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
INCOMPLETE = "incomplete"


def step_dir(step: int) -> str:
    return f"global_step_{step}"


class CheckpointError(RuntimeError):
    pass


class Checkpointer:
    def __init__(self, ckpt_path: str, s3_cfg=None, max_ckpts_to_keep: int = -1):
        self.path, self.keep = ckpt_path, max_ckpts_to_keep
        self.store = open_store(ckpt_path, s3_cfg)

    # ---- save ---------------------------------------------------------------------------------
    def save(self, step: int, trainer_state: dict, policy_state: dict, adapter_dir: str,
             rollout_adapter_dir: str | None = None) -> dict:
        """Write global_step_{step}, then the marker; returns {"seconds", "bytes"}. One attempt: S3's
        transient errors are retried by botocore (s3.max_attempts); a save that still fails is
        retried by the run at its next step (controller/fleet.py)."""
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / step_dir(step)
            shutil.copytree(adapter_dir, folder / "policy")
            if rollout_adapter_dir:
                shutil.copytree(rollout_adapter_dir, folder / ROLLOUT_ADAPTER)
            buf = io.BytesIO()
            torch.save({"optimizer": policy_state["optimizer"], "scheduler": policy_state["scheduler"],
                        "optimizer_steps": policy_state["optimizer_steps"],
                        "torch_rng": policy_state["torch_rng"]}, buf)
            (folder / "policy" / "optimizer.pt").write_bytes(buf.getvalue())
            (folder / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2, sort_keys=True))
            files = sorted(p for p in folder.rglob("*") if p.is_file())
            manifest = {"step": step, "files": {str(p.relative_to(folder)): _sha256(p.read_bytes()) for p in files}}
            (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
            size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
            self._attempt(f"upload of {step_dir(step)}", lambda: self.store.upload_dir(str(folder), step_dir(step)))
        self._attempt("commit marker", lambda: self.store.put_bytes(MARKER, str(step).encode()))
        self.prune()
        return {"seconds": time.perf_counter() - start, "bytes": size}

    def _attempt(self, what: str, fn):
        try:
            return fn()
        except (StorageError, OSError) as e:
            raise CheckpointError(f"checkpoint {what} to {self.path} failed: {e}") from None

    def prune(self) -> list[int]:
        """Delete all but the newest `max_ckpts_to_keep` checkpoints; never the committed latest."""
        if self.keep is None or self.keep < 0:
            return []
        latest, _ = self._marker()
        steps = self.steps()
        keep = set(steps[-max(self.keep, 1):]) | ({latest} if latest is not None else set())
        removed = [s for s in steps if s not in keep and (latest is None or s < latest)]
        for s in removed:
            self.store.delete(step_dir(s))
        return removed

    # ---- load ---------------------------------------------------------------------------------
    def steps(self) -> list[int]:
        out = []
        for name in self.store.list_dirs():
            if name.startswith("global_step_") and name[len("global_step_"):].isdigit():
                out.append(int(name[len("global_step_"):]))
        return sorted(out)

    def _marker(self) -> tuple[int | None, str | None]:
        """(the step the marker names, or None; what is wrong with it, or None)."""
        try:
            text = self.store.get_bytes(MARKER).decode(errors="replace").strip()
        except StorageError:
            return None, None  # no marker: nothing was ever committed, or it was lost
        if not text.isdigit():
            return None, f"the marker {MARKER} is {'empty' if not text else 'garbled (' + repr(text[:40]) + ')'}"
        return int(text), None

    def find_latest(self) -> tuple[int | None, list[str]]:
        """(the newest checkpoint that verifies, or None; a note for each thing skipped on the way).

        The marker is a hint: a checkpoint it names that is missing or corrupt, or a marker that is
        empty or garbled, falls back to the newest older checkpoint that verifies."""
        marker, problem = self._marker()
        notes = [problem] if problem else []
        steps = self.steps()
        if marker is not None and marker not in steps:
            notes.append(f"the marker names global_step_{marker}, which does not exist")
        for step in sorted((s for s in steps if marker is None or s <= marker), reverse=True):
            problem = self.verify(step)
            if problem is None:
                return step, notes
            notes.append(f"{step_dir(step)}: {problem}")
        return None, notes

    def ever_committed(self) -> bool:
        """Whether any save got as far as writing the commit marker (an empty or garbled one counts)."""
        marker, problem = self._marker()
        return marker is not None or problem is not None

    def verify(self, step: int) -> str | None:
        try:
            manifest = json.loads(self.store.get_bytes(f"{step_dir(step)}/manifest.json"))
            for rel, digest in manifest["files"].items():
                if _sha256(self.store.get_bytes(f"{step_dir(step)}/{rel}")) != digest:
                    return f"{rel} does not match its checksum"
        except (StorageError, ValueError, KeyError) as e:
            return f"{INCOMPLETE} ({e})"
        return None

    def load_trainer_state(self, step: int) -> dict:
        self._require(step)
        return json.loads(self.store.get_bytes(f"{step_dir(step)}/trainer_state.json"))

    def load_policy_state(self, step: int, adapter_out: str) -> dict:
        """Optimizer/scheduler state plus the LoRA tensors; the adapter is also copied to adapter_out."""
        from safetensors.torch import load

        self._require(step)
        d = step_dir(step)
        state = torch.load(io.BytesIO(self.store.get_bytes(f"{d}/policy/optimizer.pt")), weights_only=True)
        self._copy_adapter(f"{d}/policy", adapter_out)
        state["lora"] = load((Path(adapter_out) / "adapter_model.safetensors").read_bytes())
        return state

    def load_rollout_adapter(self, step: int, adapter_out: str) -> None:
        """The adapter the checkpoint's batch in flight is sampled with, copied to adapter_out."""
        self._require(step)
        self._copy_adapter(f"{step_dir(step)}/{ROLLOUT_ADAPTER}", adapter_out)

    def _copy_adapter(self, prefix: str, adapter_out: str) -> None:
        out = Path(adapter_out)
        tmp = temp_beside(out)
        tmp.mkdir(parents=True)
        for name in ADAPTER_FILES:
            (tmp / name).write_bytes(self.store.get_bytes(f"{prefix}/{name}"))
        replace_dir(tmp, out)

    def _require(self, step: int) -> None:
        problem = self.verify(step)
        if problem:
            raise CheckpointError(f"checkpoint {self.path}/{step_dir(step)} cannot be loaded: {problem}")


def resume_step(checkpointer, where: str) -> int | None:
    """The step to resume from (`checkpointer`: a Checkpointer, or a handle that calls one), with a
    warning for whatever was skipped; None when there is no checkpoint at all, or when the only ones
    are a first save cut short (incomplete, and no save ever committed: a job stopped during its
    first checkpoint is resubmitted as it was). Checkpoints that were committed or fail their
    checksums, of which none verifies, are an error, not a silent fresh start."""
    step, notes = checkpointer.find_latest()
    for note in notes:
        print(f"WARNING: checkpoint {where}: skipped {note}", flush=True)
    if step is None and notes:
        if all(f": {INCOMPLETE} (" in n for n in notes) and not checkpointer.ever_committed():
            print(f"WARNING: checkpoint {where}: no save was ever committed (the first one was cut short); "
                  "starting from step 0", flush=True)
            return None
        raise CheckpointError(f"no checkpoint under {where} verifies ({'; '.join(notes)}); fix or remove them, "
                              f"or start over with trainer.resume_mode=none")
    return step


def parse_step_path(path: str) -> tuple[str, int]:
    """'.../global_step_20' -> ('...', 20), for trainer.resume_path."""
    head, _, name = str(path).rstrip("/").rpartition("/")
    if not name.startswith("global_step_") or not name[len("global_step_"):].isdigit():
        raise CheckpointError(f"trainer.resume_path must end in global_step_N, got '{path}'")
    return head, int(name[len("global_step_"):])


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
