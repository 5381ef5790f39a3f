"""What the agent is told: the instruction, and the text that comes with each new picture.

Kept short on purpose: the instruction is part of every turn's prompt, and on a CPU each prompt
token is paid for at every turn of every episode.
"""

INSTRUCTION = (
    "Reach the red square. You are the blue disc; grey cells are walls. One move a turn: "
    "<action>right</action>, <action>up</action>, <action>left</action> or <action>down</action>. "
    "On the goal: <action>stop</action>."
)


def action_text(action: str) -> str:
    """The assistant answer for one action, in the format the parser reads."""
    return f"<action>{action}</action>"
