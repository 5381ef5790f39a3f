"""Play the maze through the OpenAI API: the client side of "a served agent must solve mazes".

The messages mirror the rollout's chat exactly (vlm.chat.ChatPrompter): the instruction as the
system message, the last `window` turns, and pictures only on the last `pictures` of them, so a
greedy served adapter makes the same moves as the eval harness.
"""
from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from envs.prompt import INSTRUCTION
from envs.registry import get_environment
from settings import Config
from vlm.chat import context_span


def data_url(image: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def messages_for(texts: list[str], answers: list[str], images: list[np.ndarray], window: int, pictures: int) -> list:
    n = len(texts)
    first, with_picture = context_span(n, window, pictures)
    msgs = [{"role": "system", "content": INSTRUCTION}]
    for k in range(first, n):
        content = [{"type": "text", "text": texts[k]}]
        if k >= with_picture:
            content.append({"type": "image_url", "image_url": {"url": data_url(images[k])}})
        msgs.append({"role": "user", "content": content})
        if k < n - 1:
            msgs.append({"role": "assistant", "content": answers[k]})
    return msgs


def play(chat, model: str, row: dict, cell_px: int, max_turns: int, window: int, pictures: int,
         max_tokens: int = 8) -> dict:
    """One greedy episode through `chat(model, messages, max_tokens) -> answer text`, in the row's own
    environment (its env_id: a trail row is played with the trail's pictures)."""
    task = get_environment(row["env_id"])
    env = task.make_env(cell_px, max_turns)
    image, _ = env.reset(options={"init_state": task.init_state(row)})
    texts, answers, images, reward = [""], [], [image], 0.0
    for _ in range(max_turns):
        answer = chat(model, messages_for(texts, answers, images, window, pictures), max_tokens)
        answers.append(answer)
        image, reward, terminated, truncated, info = env.step(answer)
        if terminated or truncated:
            break
        texts.append(info["feedback"])
        images.append(image)
    return {"seed": row["seed"], "solved": reward > 0, "answers": answers}


def play_as_configured(chat, model: str, row: dict, cfg: Config) -> dict:
    """`play` with the run config's picture size, turns, context window and answer length (what the
    eval harness uses), so a served episode can be compared with the harness's."""
    g = cfg.generator
    return play(chat, model, row, cfg.environment.cell_px, g.max_turns, g.context_window_turns, g.context_pictures,
                g.eval_sampling_params.max_generate_length)


def openai_chat(base_url: str):
    from openai import OpenAI
    client = OpenAI(base_url=base_url, api_key="unused")

    def chat(model, messages, max_tokens):
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0)
        return r.choices[0].message.content
    return chat
