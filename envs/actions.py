"""Parse a model's answer into one maze action.

Two formats are accepted: SkyRL's `<action>right</action>` and VisGym's tuple form
`('move', 0)` / `('stop', 'stop')` (0 right, 1 up, 2 left, 3 down). When an answer holds several
actions the last one wins. Anything else parses to None: the env turns that into feedback, never
an exception.
"""
from __future__ import annotations

import re

MOVES = ("right", "up", "left", "down")  # index = VisGym's direction code
ACTIONS = MOVES + ("stop",)

_TAG = re.compile(r"<action>\s*([A-Za-z]{1,16})\s*</action>", re.IGNORECASE)
_TUPLE = re.compile(r"""\(\s*['"](move|stop)['"]\s*,\s*(?:(\d{1,3})|['"](stop)['"])\s*\)""")


def parse_action(answer) -> str | None:
    """Return one of ACTIONS, or None when the answer holds no valid action.

    `answer` may be model text, a tuple like ('move', 2), or an action name.
    """
    if isinstance(answer, tuple):
        return _from_tuple(*answer) if len(answer) == 2 else None
    if not isinstance(answer, str):
        return None
    if answer.strip().lower() in ACTIONS:
        return answer.strip().lower()
    found = []  # (end offset, action or None)
    for m in _TAG.finditer(answer):
        name = m.group(1).lower()
        found.append((m.end(), name if name in ACTIONS else None))
    for m in _TUPLE.finditer(answer):
        payload = int(m.group(2)) if m.group(2) is not None else m.group(3)
        found.append((m.end(), _from_tuple(m.group(1), payload)))
    return max(found)[1] if found else None


def _from_tuple(branch, payload) -> str | None:
    if branch == "move" and isinstance(payload, int) and not isinstance(payload, bool) and 0 <= payload < 4:
        return MOVES[payload]
    if branch == "stop" and payload == "stop":
        return "stop"
    return None
