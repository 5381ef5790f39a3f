"""OpenAI chat-completion requests: parse, validate, turn into a generation request; build replies.

Every problem is an APIError with a status and a message naming the field, never an exception
that reaches the server loop. Images arrive as data URLs (`data:image/png;base64,...`); remote
URLs are refused (a replica fetching arbitrary URLs would be a server-side request forgery hole).
"""
from __future__ import annotations

import base64
import binascii
import io
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from serving.errors import APIError

ROLES = {"system", "user", "assistant"}
IMAGE_MIME = {"image/png", "image/jpeg", "image/jpg", "image/gif", "image/webp"}


@dataclass
class Limits:
    max_body_bytes: int = 8 * 1024 * 1024
    max_image_pixels: int = 1024 * 1024
    max_images: int = 16
    max_tokens: int = 512
    max_n: int = 8
    max_messages: int = 256


@dataclass
class ChatRequest:
    model: str
    messages: list[dict]           # role + content parts, images decoded to RGB arrays
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


def _number(body, name, default, lo, hi, kind=float):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
        raise APIError(400, f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {value!r}", name)
    if not lo <= value <= hi:
        raise APIError(400, f"'{name}' must be between {lo} and {hi}, got {value}", name)
    return kind(value)


def decode_image(url: str, limits: Limits) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    if not isinstance(url, str) or not url.startswith("data:"):
        raise APIError(400, "image_url.url must be a data URL (data:image/png;base64,...); remote URLs are not fetched",
                       "messages")
    header, _, payload = url.partition(",")
    mime = header[5:].split(";")[0].lower()
    if mime not in IMAGE_MIME or ";base64" not in header:
        raise APIError(400, f"data URL must be a base64 image ({', '.join(sorted(IMAGE_MIME))}), got '{header[:40]}'",
                       "messages")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, "image data URL is not valid base64", "messages") from None
    try:
        img = Image.open(io.BytesIO(raw))
        if img.width * img.height > limits.max_image_pixels:
            raise APIError(413, f"image is {img.width}x{img.height}; at most {limits.max_image_pixels} pixels",
                           "messages")
        return np.asarray(img.convert("RGB"))
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError):
        raise APIError(400, "image data URL does not hold a readable image", "messages") from None


def parse_chat_request(body, limits: Limits) -> ChatRequest:
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, "'model' is required: '<base_id>' or '<base_id>:<adapter>' (see GET /v1/models)", "model")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise APIError(400, "'messages' must be a non-empty list", "messages")
    if len(raw_messages) > limits.max_messages:
        raise APIError(400, f"at most {limits.max_messages} messages", "messages")
    messages, n_images = [], 0
    for i, m in enumerate(raw_messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise APIError(400, f"messages[{i}] needs a role of {sorted(ROLES)}", "messages")
        content = m.get("content")
        if isinstance(content, str):
            messages.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise APIError(400, f"messages[{i}].content must be a string or a list of parts", "messages")
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": part["text"]})
            elif kind == "image_url" and isinstance(part.get("image_url"), (dict, str)):
                url = part["image_url"]["url"] if isinstance(part["image_url"], dict) else part["image_url"]
                n_images += 1
                if n_images > limits.max_images:
                    raise APIError(400, f"at most {limits.max_images} images a request", "messages")
                parts.append({"type": "image", "image": decode_image(url, limits)})
            else:
                raise APIError(400, f"messages[{i}].content[{j}] must be a text or image_url part", "messages")
        messages.append({"role": m["role"], "content": parts})
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) for s in stop):
        raise APIError(400, "'stop' must be a string or a list of at most 4 strings", "stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise APIError(400, "'seed' must be an integer", "seed")
    return ChatRequest(model=model, messages=messages,
                       temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                       top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
                       max_tokens=_number(body, "max_tokens", 16, 1, limits.max_tokens, int),
                       n=_number(body, "n", 1, 1, limits.max_n, int), stop=stop, seed=seed)


def chat_response(model: str, texts: list[str], finish: list[str], prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": f}
                        for i, (t, f) in enumerate(zip(texts, finish))],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}
