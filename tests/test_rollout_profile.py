"""bench/rollout_profile.py's timers: a call timed inside another is reported, never counted twice."""
import time

from bench.rollout_profile import Timers


class Engine:
    def decode(self):
        time.sleep(0.02)
        return self.prefill()

    def prefill(self):
        time.sleep(0.03)
        return "done"


def test_a_nested_timer_is_part_of_its_caller_not_added_to_it():
    synced = []
    timers = Timers(lambda: synced.append(1))
    engine = Engine()
    timers.wrap(engine, "decode", "decode", synced=True)
    timers.wrap(Engine, "prefill", "of which prefill", nested=True)  # on the class, as the profile does
    assert engine.decode() == "done"
    assert timers.total["of which prefill"] >= 0.03
    assert timers.total["decode"] >= 0.05
    assert timers.outermost() == timers.total["decode"]
    assert len(synced) == 2  # the synced timer syncs before and after
