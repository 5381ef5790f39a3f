"""The Qwen-VL chat markup (shared by Qwen2-VL, Qwen2.5-VL, Qwen3-VL and the embedded base), and
prompt building token by token.

Multi-turn rollouts build each turn's prompt from stored token pieces rather than re-rendering
text: the model's earlier answers go back in as the exact ids it produced (re-tokenizing its text
could give other ids, and the trainer would then score tokens the model never sampled). With a
context window, turns older than the window are dropped whole; a picture window can further drop the
pictures (not the text) of all but the last few turns.
"""
from __future__ import annotations

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or part['type'] == 'image_url' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def context_span(n_turns: int, window: int, pictures: int) -> tuple[int, int]:
    """(first turn kept, first turn that keeps its picture) for the current turn n_turns - 1.
    window=0 keeps every turn, window=K the last K; pictures=0 keeps every kept turn's picture,
    pictures=P only the last P. The rollout and the API client (serving.maze_client) share it."""
    first = 0 if window <= 0 else max(0, n_turns - window)
    return first, first if pictures <= 0 else max(first, n_turns - pictures)


class ChatPrompter:
    """Token pieces of the Qwen-VL chat: a system message, user turns with one picture, answers."""

    def __init__(self, tokenizer, image_tokens_per_picture: int, instruction: str):
        self.tok = tokenizer
        self.image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.n_image = image_tokens_per_picture
        self.head = self._ids(f"<|im_start|>system\n{instruction}<|im_end|>\n")
        self.newline = self._ids("\n")
        self._cache: dict[tuple[str, bool], list[int]] = {}

    def _ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def user_turn(self, text: str, picture: bool = True) -> list[int]:
        """A user message: text then (optionally) the picture, and the assistant header that asks for
        an answer. Tokenized per piece: pieces meet at special tokens, so this equals tokenizing the
        whole rendered chat."""
        key = (text, picture)
        if key not in self._cache:
            image = ([self.image_token_id] * self.n_image + self._ids("<|vision_end|>")) if picture else []
            self._cache[key] = (self._ids(f"<|im_start|>user\n{text}" + ("<|vision_start|>" if picture else ""))
                                + image + self._ids("<|im_end|>\n<|im_start|>assistant\n"))
        return self._cache[key]

    def answer_ids(self, text: str) -> list[int]:
        """An answer written for the model (the expert's, an exploratory move) as the ids it would
        sample: the text, then <|im_end|>."""
        return self._ids(text) + [self.end_id]

    def closed_answer(self, response_ids: list[int]) -> list[int]:
        """The model's answer as it goes back into the context: its own ids, closed by <|im_end|>\\n."""
        return list(response_ids) + ([] if response_ids and response_ids[-1] == self.end_id else [self.end_id]) \
            + self.newline

    def prompt(self, user_texts: list[str], answers: list[list[int]], window: int = 0,
               pictures: int = 0) -> tuple[list[int], list[int]]:
        """Prompt for the last user turn; returns (ids, the turns whose pictures it holds).

        user_texts[k] and answers[k] are turn k's text and sampled answer ids (answers has one entry
        fewer). window=0 keeps every turn, window=K the last K (the current one included);
        pictures=0 keeps the picture of every kept turn, pictures=P only the last P.
        """
        n = len(user_texts)
        first, with_picture = context_span(n, window, pictures)
        ids = list(self.head)
        for k in range(first, n):
            ids += self.user_turn(user_texts[k], picture=k >= with_picture)
            if k < n - 1:
                ids += self.closed_answer(answers[k])
        return ids, list(range(with_picture, n))
