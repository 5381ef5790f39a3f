"""What the agent is told: the instruction, and the text that comes with each new picture.

Kept short on purpose: the instruction is part of every turn's prompt, and on a CPU each prompt
token is paid for at every turn of every episode.
"""
from envs.actions import ACTIONS
from envs.maze import INVALID_ACTION, WALL_HIT

INSTRUCTION = (
    "Reach the red square. You are the blue disc; grey cells are walls. One move a turn: "
    "<action>right</action>, <action>up</action>, <action>left</action> or <action>down</action>. "
    "On the goal: <action>stop</action>."
)


def action_text(action: str) -> str:
    """The assistant answer for one action, in the format the parser reads."""
    return f"<action>{action}</action>"


def tokenizer_corpus() -> list[str]:
    """The maze chat's texts, weighted, that the embedded base's tokenizer was trained on (vlm.build)."""
    feedback = [INVALID_ACTION, WALL_HIT, "Stopped on the goal.", "Stopped away from the goal."]
    feedback += [f"Moved {a}." for a in ACTIONS[:4]]
    answers = [action_text(a) for a in ACTIONS] + [f"('move', {i})" for i in range(4)] + ["('stop', 'stop')"]
    return [INSTRUCTION] * 20 + feedback * 20 + answers * 50 + ["user", "assistant", "system"] * 20
