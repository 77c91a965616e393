"""The progress poller: fast while there is work, slow when idle, alive after a failing step."""

import time

from kvscope.connector.p2p.poller import ProgressPoller


def _steps_in(poller: ProgressPoller, seconds: float) -> int:
    before = poller.stats.steps
    time.sleep(seconds)
    return poller.stats.steps - before


def test_polls_fast_only_while_busy_or_kept_hot():
    busy = [False]
    poller = ProgressPoller(lambda: busy[0], busy_interval_s=0.001, idle_interval_s=0.05)
    try:
        idle_steps = _steps_in(poller, 0.3)
        busy[0] = True
        busy_steps = _steps_in(poller, 0.3)
        busy[0] = False
        poller.keep_hot(0.3)
        hot_steps = _steps_in(poller, 0.2)
        time.sleep(0.15)
        cooled_steps = _steps_in(poller, 0.3)
    finally:
        poller.stop()
    assert idle_steps <= 10  # ~6 at 50 ms
    assert busy_steps >= 50 and hot_steps >= 40  # ~300 at 1 ms, fewer on a loaded machine
    assert cooled_steps <= 10


def test_a_failing_step_does_not_stop_the_poller():
    calls = []

    def step() -> bool:
        calls.append(1)
        if len(calls) <= 3:
            raise RuntimeError("bug in a step")
        return True

    poller = ProgressPoller(step, busy_interval_s=0.001, idle_interval_s=0.01)
    try:
        time.sleep(0.2)
    finally:
        poller.stop()
    assert poller.stats.step_errors == 3
    assert poller.stats.busy_steps > 3
