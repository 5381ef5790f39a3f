"""OpenAI chat-completion requests: parse, validate, turn into a generation request; build replies.

Every problem is an APIError with a status and a message naming the field, never an exception
that reaches the server loop. Images arrive as data URLs (`data:image/png;base64,...`); remote
URLs are refused (a replica fetching arbitrary URLs would be a server-side request forgery hole).
"""
from __future__ import annotations

import base64
import binascii
import io
import json
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from serving.errors import APIError

ROLES = {"system", "user", "assistant"}
IMAGE_MIME = {"image/png", "image/jpeg", "image/jpg", "image/gif", "image/webp"}
# Request fields this server reads; OpenAI's bookkeeping fields are accepted and ignored; anything
# else (a typo, or a feature such as logit_bias this server does not have) is refused by name.
FIELDS = {"model", "messages", "temperature", "top_p", "max_tokens", "max_completion_tokens", "n", "stop", "seed",
          "stream", "stream_options"}
IGNORED = {"user", "metadata", "store"}
MIN_TEMPERATURE = 0.01  # below it (but above 0, which is greedy) the sampler's probabilities overflow


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
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the token counts


def _number(body, name, default, lo, hi, kind=float):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
        raise APIError(400, f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {value!r}", name)
    if not lo <= value <= hi:
        raise APIError(400, f"'{name}' must be between {lo} and {hi}, got {value}", name)
    return kind(value)


def _text(value: str, where: str) -> str:
    """Text the tokenizer can take: valid Unicode (JSON can carry lone surrogates, which it cannot)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(400, f"{where} is not valid Unicode (it holds a lone surrogate)", "messages") from None
    return value


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
    unknown = sorted(set(body) - FIELDS - IGNORED)
    if unknown:
        raise APIError(400, f"unrecognized request field {unknown[0][:64]!r}; this server reads "
                            f"{', '.join(sorted(FIELDS))}", unknown[0][:64])
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
            messages.append({"role": m["role"], "content": _text(content, f"messages[{i}].content")})
            continue
        if not isinstance(content, list):
            raise APIError(400, f"messages[{i}].content must be a string or a list of parts", "messages")
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": _text(part["text"], f"messages[{i}].content[{j}].text")})
            elif kind == "image_url" and isinstance(part.get("image_url"), (dict, str)):
                url = part["image_url"].get("url") if isinstance(part["image_url"], dict) else part["image_url"]
                if not isinstance(url, str):
                    raise APIError(400, f"messages[{i}].content[{j}].image_url needs a 'url' (a data URL)", "messages")
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
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and 0 < len(s) <= 64 for s in stop):
        raise APIError(400, "'stop' must be a string or a list of at most 4 strings of 1-64 characters", "stop")
    stop = [_text(s, "'stop'") for s in stop]
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63):
        raise APIError(400, "'seed' must be an integer from 0 to 2**63 - 1", "seed")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    if 0 < temperature < MIN_TEMPERATURE:
        raise APIError(400, f"'temperature' must be 0 (greedy) or from {MIN_TEMPERATURE} to 2, got {temperature}",
                       "temperature")
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p < MIN_TEMPERATURE:
        raise APIError(400, f"'top_p' must be from {MIN_TEMPERATURE} to 1, got {top_p}", "top_p")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise APIError(400, "'stream' must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"} or \
            not isinstance(options.get("include_usage", False), bool):
        raise APIError(400, "'stream_options' may hold only include_usage (true or false)", "stream_options")
    tokens_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return ChatRequest(model=model, messages=messages, temperature=temperature, top_p=top_p,
                       max_tokens=_number(body, tokens_key, 16, 1, limits.max_tokens, int),
                       n=_number(body, "n", 1, 1, limits.max_n, int), stop=stop, seed=seed, stream=bool(stream),
                       include_usage=options.get("include_usage", False))


def chat_response(model: str, texts: list[str], finish: list[str], prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": f}
                        for i, (t, f) in enumerate(zip(texts, finish))],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def stream_chunks(response: dict, include_usage: bool):
    """A finished chat.completion as OpenAI's server-sent chunk events: per choice the role, the
    content and the finish reason, then the usage if asked for, then [DONE]."""
    base = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"],
            "model": response["model"]}

    def event(choices, **extra):
        return f"data: {json.dumps({**base, 'choices': choices, **extra})}\n\n"
    for c in response["choices"]:
        yield event([{"index": c["index"], "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        yield event([{"index": c["index"], "delta": {"content": c["message"]["content"]}, "finish_reason": None}])
        yield event([{"index": c["index"], "delta": {}, "finish_reason": c["finish_reason"]}])
    if include_usage:
        yield event([], usage=response["usage"])
    yield "data: [DONE]\n\n"
