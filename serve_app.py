"""Serve many LoRA adapters over one resident base model, with an OpenAI-compatible API.

    serve run serve_app:app                                    embedded base, adapters from runs/default/exports
    serve run serve_app:app dynamic_lora_loading_path=s3://bucket/adapters max_loras=2
    serve run configs/serve.yaml                               the same from a Serve config file

`model` selects the adapter: `<base_id>` is the base model, `<base_id>:<adapter>` one adapter found
under `dynamic_lora_loading_path`. Adapters are downloaded on first use, kept resident up to
`max_loras` (least recently used evicted, reloaded on demand), and concurrent requests for one
adapter that sample alike go to the model as one batch. Binds 127.0.0.1 unless Serve's http_options
say otherwise. With backend=vllm the same settings drive ray.serve.llm (vLLM's continuous batching:
the GPU path); the hf app is the CPU path and the fallback where vLLM cannot run.
"""

import asyncio
import json
import logging
import re
import time
from dataclasses import asdict
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve

from serving.adapters import AdapterSource, ResidentAdapters, validate_name
from serving.errors import APIError
from serving.schema import ChatRequest, Limits, chat_response, parse_chat_request, stream_chunks
from serving.settings import ServeSettings
from settings.schema import S3Config

api = FastAPI(title="visrl multi-LoRA server")
log = logging.getLogger("visrl.serve")
MODEL_ID = re.compile(r"[A-Za-z0-9._-]{1,128}(:[A-Za-z0-9._-]{1,128})?")


def _metrics() -> dict:
    from ray.util.metrics import Counter, Histogram
    buckets = [0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
    return {"load": Histogram("visrl_serve_adapter_load_seconds", "adapter cold load (download + apply)",
                              boundaries=buckets, tag_keys=("adapter",)),
            "download": Histogram("visrl_serve_adapter_download_seconds", "adapter download", boundaries=buckets,
                                  tag_keys=("adapter",)),
            "apply": Histogram("visrl_serve_adapter_apply_seconds", "adapter apply to the model", boundaries=buckets,
                               tag_keys=("adapter",)),
            "latency": Histogram("visrl_serve_request_seconds", "request latency by model id and status class",
                                 boundaries=buckets, tag_keys=("model", "status")),
            "hits": Counter("visrl_serve_adapter_cache_hits", "requests whose adapter was resident"),
            "misses": Counter("visrl_serve_adapter_cache_misses", "requests that loaded their adapter"),
            "evictions": Counter("visrl_serve_adapter_evictions", "adapters evicted (LRU)")}


@serve.deployment(health_check_period_s=10, health_check_timeout_s=30, max_ongoing_requests=64)
@serve.ingress(api)
class MultiLoraServer:
    def __init__(self, settings: dict):
        import torch

        from inference.hf_backend import HFBackend
        from vlm.load import DEFAULT_CACHE, load_model, resolve_device

        self.s = ServeSettings(**settings)
        device = resolve_device(self.s.device)
        s3 = S3Config(endpoint_url=self.s.s3_endpoint_url or None)
        model, processor = load_model(self.s.base_model, device, torch.bfloat16 if device == "cuda" else torch.float32, s3,
                                      speedups=self.s.speedups)
        self.backend = HFBackend(model, processor, device)  # `generate`: CUDA graphs would pin one adapter
        self.limits = Limits(max_body_bytes=self.s.max_body_bytes, max_image_pixels=self.s.max_image_pixels,
                             max_tokens=self.s.max_tokens)
        self.source = AdapterSource(self.s.dynamic_lora_loading_path or None,
                                    self.s.cache_dir or str(DEFAULT_CACHE / "adapters"), self.s.base_id,
                                    self.s.max_lora_rank, s3)
        self.metrics = _metrics()
        self.resident = ResidentAdapters(self.s.max_loras, self._fetch_adapter, self._apply_adapter,
                                         self._unload_adapter, self.metrics)
        self.generate_batch.set_max_batch_size(self.s.max_batch_size)
        self.generate_batch.set_batch_wait_timeout_s(self.s.batch_wait_timeout_s)
        for name in self.s.prewarm_names():
            self.resident.preload(name)

    # ---- adapters (called with the model otherwise idle: see generate_batch) ------------------
    def _fetch_adapter(self, name: str) -> str:
        folder, download_s = self.source.fetch(name)
        self.metrics["download"].observe(download_s, tags={"adapter": name})
        return folder

    def _apply_adapter(self, name: str, folder: str) -> None:
        start = time.perf_counter()
        self.backend.add_adapter(name, folder)
        self.metrics["apply"].observe(time.perf_counter() - start, tags={"adapter": name})

    def _unload_adapter(self, name: str) -> None:
        self.backend.remove_adapter(name)

    # ---- API ----------------------------------------------------------------------------------
    @api.get("/health")
    def health(self):
        return {"status": "ok", "base_id": self.s.base_id, "resident_adapters": list(self.resident.resident)}

    def check_health(self):  # Serve's replica health check
        if self.backend.model is None:
            raise RuntimeError("model not loaded")

    @api.get("/v1/models")
    def models(self):
        ids = [self.s.base_id] + [f"{self.s.base_id}:{n}" for n in self.source.names()]
        return {"object": "list", "data": [{"id": i, "object": "model", "created": 0, "owned_by": "visrl"} for i in ids]}

    @api.get("/v1/adapters/stats")
    def adapter_stats(self):
        return {"resident": list(self.resident.resident), "hits": self.resident.hits, "misses": self.resident.misses,
                "evictions": self.resident.evictions, "load_seconds": dict(self.resident.resident)}

    @api.post("/v1/chat/completions")
    async def chat(self, request: Request):
        start = time.perf_counter()
        tag = "unknown"  # the latency metric's model tag: a known model id, never the client's raw string
        status = "5xx"  # its status class: 2xx, 4xx (the client's mistake) or 5xx
        try:
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                raise APIError(415, f"request body must be sent as application/json, not '{kind[:64] or 'none'}'")
            size = int(request.headers.get("content-length") or 0)
            if size > self.limits.max_body_bytes:
                raise APIError(413, f"request body is {size} bytes; at most {self.limits.max_body_bytes}")
            raw = await request.body()
            if len(raw) > self.limits.max_body_bytes:
                raise APIError(413, f"request body is {len(raw)} bytes; at most {self.limits.max_body_bytes}")
            try:
                body = json.loads(raw)
            except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: '[' * 100000
                raise APIError(400, "request body is not valid JSON") from None
            req = parse_chat_request(body, self.limits)
            adapter = self._adapter_of(req.model)
            tag = req.model  # a served model id from here on: its errors count against it
            result = await self.generate_batch((req, adapter))
            if isinstance(result, APIError):
                raise result
            status = "2xx"
            if req.stream:
                return StreamingResponse(stream_chunks(result, req.include_usage), media_type="text/event-stream")
            return JSONResponse(result)
        except APIError as e:
            status = f"{e.status // 100}xx"
            return JSONResponse(e.body(), status_code=e.status)
        except Exception:  # the server stays up; the client learns that it failed, not the server's internals
            log.exception("chat request failed")
            return JSONResponse(APIError(500, "internal error; the request was not completed").body(), status_code=500)
        finally:
            self.metrics["latency"].observe(time.perf_counter() - start, tags={"model": tag, "status": status})

    def _adapter_of(self, model: str) -> str | None:
        """The adapter a model id names (None: the base). Ids outside the pattern are refused
        before any lookup or metric sees them."""
        if not MODEL_ID.fullmatch(model):
            raise APIError(400, "invalid model id: use '<base_id>' or '<base_id>:<adapter>' with letters, digits, "
                                "'.', '_' and '-' only (GET /v1/models lists them)", "model")
        base, sep, adapter = model.partition(":")
        if base != self.s.base_id:
            raise APIError(404, f"model '{model}' does not exist; GET /v1/models lists the models", "model")
        return validate_name(adapter) if sep else None

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.01)
    async def generate_batch(self, items: list[tuple[ChatRequest, str | None]]) -> list:
        """Concurrent requests, grouped by adapter; one model call per (adapter, sampling) group."""
        results: list = [None] * len(items)
        by_adapter: dict = {}
        for i, (_, adapter) in enumerate(items):
            by_adapter.setdefault(adapter, []).append(i)
        for adapter, idx in by_adapter.items():
            try:
                if adapter is not None:
                    seconds = await self.resident.ensure(adapter)
                    if seconds:
                        self.metrics["load"].observe(seconds, tags={"adapter": adapter})
                for i, out in zip(idx, await asyncio.to_thread(self._run_group, adapter, [items[i][0] for i in idx])):
                    results[i] = out
            except APIError as e:
                for i in idx:
                    results[i] = e
            except Exception:  # an adapter that fails to load fails its own requests, not the batch
                log.exception("adapter %s failed", adapter)
                for i in idx:
                    results[i] = APIError(500, "internal error while loading the adapter; the request was not completed")
        return results

    def _run_group(self, adapter: str | None, reqs: list[ChatRequest]) -> list:
        """One model call for the requests that sample alike (most of a batch: the same max_tokens,
        temperature, top_p, seed and stop), so concurrent requests share the device's batch."""
        from inference.requests import GenRequest, Sampling
        out: list = [None] * len(reqs)
        alike: dict = {}
        for i, req in enumerate(reqs):
            try:
                tokenized = self.backend.tokenize_messages(GenRequest(messages=req.messages))
            except ValueError as e:  # e.g. a picture the processor cannot take
                out[i] = APIError(400, str(e)[:300])
                continue
            if len(tokenized.prompt_ids) + req.max_tokens > self.s.max_model_len:
                out[i] = APIError(400, f"prompt ({len(tokenized.prompt_ids)} tokens) + max_tokens ({req.max_tokens}) "
                                       f"exceeds max_model_len={self.s.max_model_len}", "max_tokens")
                continue
            sampling = Sampling(max_new_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p,
                                seed=req.seed, stop=list(req.stop or []))
            key = (sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.seed, tuple(sampling.stop))
            alike.setdefault(key, (sampling, []))[1].append((i, tokenized))
        with self.backend.adapter(adapter):
            for sampling, members in alike.values():
                try:
                    flat = [tok for i, tok in members for _ in range(reqs[i].n)]
                    results = iter(self.backend.generate(flat, sampling, adapter_version=0))
                    for i, tok in members:
                        res = [next(results) for _ in range(reqs[i].n)]
                        out[i] = chat_response(reqs[i].model, [r.text for r in res], [r.finish_reason for r in res],
                                               len(tok.prompt_ids), sum(len(r.token_ids) for r in res))
                except Exception:  # this group's requests fail, the server and the other groups go on
                    log.exception("generation failed")
                    for i, _ in members:
                        out[i] = APIError(500, "internal error; the request was not completed")
        return out


def build_vllm_app(s: ServeSettings):
    """The same settings on ray.serve.llm: vLLM's engine behind Ray's OpenAI app.

    ray.serve.llm downloads adapters itself and reads only cloud paths (s3://, gs://), so
    `dynamic_lora_loading_path` must be one; `s3_endpoint_url` reaches an S3-compatible store. On a
    machine without a GPU it runs vLLM's CPU build: a CPU placement bundle of `num_cpus`, the KV
    cache and threads set as the rollout engine sets them, fp32 as the hf server computes there.
    """
    from inference.vllm_backend import cpu_env, engine_kwargs
    from serving.ray_llm import import_serve_llm
    from vlm.load import resolve_device

    if not str(s.dynamic_lora_loading_path).startswith(("s3://", "gs://")):
        raise ValueError(f"backend=vllm serves adapters through ray.serve.llm, which reads only s3:// or gs:// "
                         f"paths; dynamic_lora_loading_path={s.dynamic_lora_loading_path!r} is not one: upload "
                         "the adapters (e.g. trainer.export_path=s3://...) or use backend=hf")
    LLMConfig, build_openai_app = import_serve_llm()
    from serving.ray_llm_server import PREWARM_ENV
    on_cpu = resolve_device(s.device) == "cpu"
    base = s.base_model if "://" in s.base_model else str(Path(s.base_model).resolve())
    env = {"AWS_ENDPOINT_URL": s.s3_endpoint_url} if s.s3_endpoint_url else {}
    options = {}
    if on_cpu:
        env |= cpu_env(int(s.num_cpus))
        options = {"accelerator_config": {"kind": "cpu"}, "placement_group_config": {"bundles": [{"CPU": s.num_cpus}]}}
    config = LLMConfig(
        model_loading_config={"model_id": s.base_id, "model_source": base},
        lora_config={"dynamic_lora_loading_path": s.dynamic_lora_loading_path.rstrip("/"),
                     "max_num_adapters_per_replica": s.max_loras},
        engine_kwargs={"max_model_len": s.max_model_len, "dtype": "float32" if on_cpu else "bfloat16",
                       **engine_kwargs(on_cpu, s.max_lora_rank, s.max_loras)},
        runtime_env={"env_vars": env | {PREWARM_ENV: ",".join(s.prewarm_names())}},
        server_cls="serving.ray_llm_server.PrewarmedLLMServer", deployment_config=_deployment_options(s), **options)
    # the router lists adapters too, so it needs the store's endpoint as the engine's replica does
    ingress = {"ray_actor_options": {"runtime_env": {"env_vars": env}}} if s.s3_endpoint_url else {}
    return build_openai_app({"llm_configs": [config], "ingress_deployment_config": ingress})


def _deployment_options(s: ServeSettings) -> dict:
    if s.max_replicas > max(s.min_replicas, 0) and s.max_replicas > 1:
        return {"autoscaling_config": {"min_replicas": s.min_replicas, "max_replicas": s.max_replicas,
                                       "target_ongoing_requests": 8}}
    return {"num_replicas": s.num_replicas}


def app(args: dict | None = None):
    """Serve application builder: `serve run serve_app:app key=value ...`."""
    s = ServeSettings.from_args(args or {})
    if s.backend == "vllm":
        return build_vllm_app(s)
    return MultiLoraServer.options(ray_actor_options={"num_cpus": s.num_cpus, "num_gpus": replica_gpus(s)},
                                   **_deployment_options(s)).bind(asdict(s))


def replica_gpus(s: ServeSettings) -> float:
    """GPUs each hf replica asks Ray for: `num_gpus` when set; else one where the replica must run on a
    GPU (device=cuda, or device=auto on a cluster that has GPUs): Ray hides every GPU from an actor
    that asks for none, so the replica would fall back to the CPU."""
    if s.num_gpus or s.device == "cpu":
        return s.num_gpus
    import ray
    has_gpus = ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0
    return 1.0 if s.device == "cuda" or has_gpus else 0.0
