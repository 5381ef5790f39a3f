"""The run controller: the actors' lives (start where the plan puts them, teardown), checkpoint timing
and restore, recovery from a lost actor or node, chaos on purpose, and the Ray connection a run
makes. placement/ says where things go; this package makes it so and keeps it so."""
