"""Pictures of the maze in VisGym's colours and layout, and a text view for debugging."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

FLOOR_RGB = (255, 255, 255)
WALL_RGB = (169, 169, 169)
GOAL_RGB = (255, 0, 0)
AGENT_RGB = (0, 0, 255)
TRAIL_RGB = (255, 215, 120)  # visrl's trail variant: a cell the agent has left
BUMP_RGB = (90, 50, 20)  # visrl's trail variant: a wall the agent has run into
MARK_RGB = (100, 190, 100)  # visrl's marks variant: a cell the agent has walked back out of (green: an orange
# one was read as the red goal, bench/record/)


def render_background(maze: np.ndarray, target, cell_px: int) -> np.ndarray:
    """Walls, floor and the goal square: everything but the agent (fixed within an episode)."""
    colours = np.array([FLOOR_RGB, WALL_RGB], dtype=np.uint8)[maze.astype(np.intp)]
    colours[tuple(target)] = GOAL_RGB
    return np.repeat(np.repeat(colours, cell_px, axis=0), cell_px, axis=1)


@lru_cache(maxsize=8)
def _disc(cell_px: int) -> np.ndarray:
    # Pixel centres within a quarter cell of the cell centre (VisGym's radius).
    centres = np.arange(cell_px) + 0.5 - cell_px / 2
    return centres[:, None] ** 2 + centres[None, :] ** 2 <= (cell_px / 4) ** 2


def paint_cell(background: np.ndarray, cell, cell_px: int, colour) -> None:
    """Paint one whole cell (in place): the trail variants' cells left and walls run into."""
    r, c = int(cell[0]) * cell_px, int(cell[1]) * cell_px
    background[r:r + cell_px, c:c + cell_px] = colour


def draw_agent(background: np.ndarray, agent, cell_px: int) -> np.ndarray:
    image = background.copy()
    r, c = int(agent[0]) * cell_px, int(agent[1]) * cell_px
    image[r:r + cell_px, c:c + cell_px][_disc(cell_px)] = AGENT_RGB
    return image


def render_text(maze: np.ndarray, agent, target) -> str:
    """'#' wall, ' ' floor, 'T' goal, 'A' agent ('A' wins when it stands on the goal)."""
    rows = [["#" if v else " " for v in row] for row in maze]
    rows[target[0]][target[1]] = "T"
    rows[agent[0]][agent[1]] = "A"
    return "\n".join("".join(row) for row in rows)
