"""Shared fixtures: a tiny random Qwen3-VL-shaped model saved to disk, built once per session."""
import os

import pytest
import torch

from deploy.local_s3 import S3Server

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60 turns dashboard token auth on by default
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Credentials for the local S3 server, set before any Ray worker starts so workers inherit them.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    session.config.visrl_session = session


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End the test process once pytest has reported, skipping the interpreter's finalisation.
    After ray.shutdown() Ray leaves native threads running in this process (gcs_client_io, worker.io,
    gRPC's pollers: counted after tests/test_placement.py alone). CI's run of 2026-12-02 passed every
    test and then died with SIGSEGV in that finalisation (ray-project/ray#31145 is that class of fault).
    The drivers and servers under test run in their own processes, and their exits are asserted."""
    session = getattr(config, "visrl_session", None)
    if session is None:  # pytest stopped before a session (a usage error): its own exit code stands
        return
    import sys
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(session.exitstatus))


TINY = dict(text_hidden=32, text_layers=1, text_heads=2, text_kv_heads=1, text_intermediate=64,
            vision_hidden=32, vision_layers=2, vision_heads=2, vision_intermediate=64)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from envs.prompt import tokenizer_corpus
    from vlm.build import EmbeddedArch, build_random_base
    out = tmp_path_factory.mktemp("tiny-model")
    model, processor = build_random_base(EmbeddedArch(**TINY), seed=0, corpus=tokenizer_corpus())
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def prompter(tiny_model_dir):
    """The chat prompter of the tiny model (81 picture tokens a maze)."""
    from envs.prompt import INSTRUCTION
    from vlm.chat import ChatPrompter
    from vlm.processor import load_processor
    return ChatPrompter(load_processor(tiny_model_dir).tokenizer, 81, INSTRUCTION)


@pytest.fixture(scope="session")
def adapter_dir(tiny_model_dir, tmp_path_factory):
    """A random (non-zero) all-linear LoRA of the tiny model, in PEFT's layout."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText
    torch.manual_seed(1)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    out = tmp_path_factory.mktemp("adapter")
    peft.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def tiny_run(tiny_model_dir, tmp_path_factory):
    """(run folder, finished process) of two GRPO steps of the tiny model through the real driver
    (tests.helpers.tiny_run_args), made once: several tests read it, none changes it."""
    from tests.helpers import run_driver, tiny_run_args
    run = tmp_path_factory.mktemp("tiny-run") / "run"
    return run, run_driver(tiny_run_args(tiny_model_dir, run))


@pytest.fixture(scope="session")
def s3_server():
    server = S3Server()
    yield server
    server.stop()


