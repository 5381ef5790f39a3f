"""ray.serve.llm's LLMServer with a pre-warm list: the adapters named in $VISRL_SERVE_PREWARM (set
through the replica's runtime env by serve_app's vLLM builder) are loaded once the engine is up,
through the same multiplexed loader a request uses, so the first request for one finds it resident
and Serve routes it to this replica. Imports ray.serve.llm (and so vLLM): only the vLLM path loads it."""
from __future__ import annotations

import os

from ray.serve.llm.deployment import LLMServer

PREWARM_ENV = "VISRL_SERVE_PREWARM"


class PrewarmedLLMServer(LLMServer):
    async def start(self):
        await super().start()
        for name in [n.strip() for n in os.environ.get(PREWARM_ENV, "").split(",") if n.strip()]:
            await self.engine.resolve_lora(await self._load_model(f"{self._llm_config.model_id}:{name}"))
