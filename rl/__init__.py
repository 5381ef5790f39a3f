"""The RL logic that is not an actor: multi-turn rollouts, advantages, losses."""
