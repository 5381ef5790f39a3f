"""Tools for the user of a run, beside the driver: several seeds of a config (seeds.py), a run's
summary (summarize_run.py), how a greedy agent fails (failure_modes.py), and publishing a run's adapter
for serving (publish.py). Benchmarks, which record the project's own figures, are in bench/."""
