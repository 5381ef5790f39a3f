"""The Qwen-VL chat markup (shared by Qwen2-VL, Qwen2.5-VL, Qwen3-VL and the embedded base), and
prompt building token by token.

Multi-turn rollouts build each turn's prompt from stored token pieces rather than re-rendering
text: the model's earlier answers go back in as the exact ids it produced (re-tokenizing its text
could give other ids, and the trainer would then score tokens the model never sampled). With a
context window, turns older than the window are dropped whole, picture and text together.
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


class ChatPrompter:
    """Token pieces of the Qwen-VL chat: a system message, user turns with one picture, answers."""

    def __init__(self, tokenizer, image_tokens_per_picture: int, instruction: str):
        self.tok = tokenizer
        self.image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.n_image = image_tokens_per_picture
        self.head = self._ids(f"<|im_start|>system\n{instruction}<|im_end|>\n")
        self.newline = self._ids("\n")

    def _ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def user_turn(self, text: str) -> list[int]:
        """A user message: text then the picture, and the assistant header that asks for an answer."""
        return (self._ids(f"<|im_start|>user\n{text}<|vision_start|>") + [self.image_token_id] * self.n_image
                + self._ids("<|vision_end|><|im_end|>\n<|im_start|>assistant\n"))

    def closed_answer(self, response_ids: list[int]) -> list[int]:
        """The model's answer as it goes back into the context: its own ids, closed by <|im_end|>\\n."""
        return list(response_ids) + ([] if response_ids and response_ids[-1] == self.end_id else [self.end_id]) \
            + self.newline

    def prompt(self, user_turns: list[list[int]], answers: list[list[int]], window: int) -> tuple[list[int], int]:
        """Prompt for the last user turn; returns (ids, index of the first turn kept).

        user_turns[k] and answers[k] are turn k's pieces (answers has one entry fewer). window=0
        keeps every turn; window=K keeps the last K turns, the current one included.
        """
        first = 0 if window <= 0 else max(0, len(user_turns) - window)
        ids = list(self.head)
        for k in range(first, len(user_turns) - 1):
            ids += user_turns[k] + self.closed_answer(answers[k])
        return ids + user_turns[-1], first
