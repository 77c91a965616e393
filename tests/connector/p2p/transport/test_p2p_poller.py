"""The progress poller: steps at the pace each step asks for, sleeps until woken, survives bugs."""

import time

from kvscope.connector.p2p.transport.poller import ProgressPoller


def _steps_in(poller: ProgressPoller, seconds: float) -> int:
    before = poller.stats.steps
    time.sleep(seconds)
    return poller.stats.steps - before


def test_polls_fast_only_while_busy_or_kept_hot_and_not_at_all_when_idle():
    pace: list[float | None] = [None]
    poller = ProgressPoller(lambda: pace[0], hot_interval_s=0.001)
    try:
        time.sleep(0.05)  # the first step runs at start
        idle_steps = _steps_in(poller, 0.3)
        pace[0] = 0.001
        poller.wake()
        busy_steps = _steps_in(poller, 0.3)
        pace[0] = None
        time.sleep(0.02)
        poller.keep_hot(0.3)
        hot_steps = _steps_in(poller, 0.2)
        time.sleep(0.15)
        cooled_steps = _steps_in(poller, 0.3)
        before_wake = poller.stats.steps
        poller.wake()
        time.sleep(0.05)
        woken_steps = poller.stats.steps - before_wake
    finally:
        poller.stop()
    assert idle_steps == 0  # asleep until woken
    assert busy_steps >= 50 and hot_steps >= 40  # ~300 at 1 ms, fewer on a loaded machine
    assert cooled_steps == 0
    assert woken_steps == 1


def test_a_wake_during_a_step_is_not_lost():
    woken_during_step: list[bool] = []

    def step() -> None:
        if not woken_during_step:
            woken_during_step.append(True)
            poller.wake()  # e.g. read_blocks() from another thread while the step runs
        return None

    poller = ProgressPoller(step)
    try:
        time.sleep(0.2)
    finally:
        poller.stop()
    assert poller.stats.steps == 2  # the first step, and the one the wake asked for


def test_a_failing_step_does_not_stop_the_poller():
    calls = []

    def step() -> float:
        calls.append(1)
        if len(calls) <= 3:
            raise RuntimeError("bug in a step")
        return 0.001

    poller = ProgressPoller(step, error_retry_s=0.01)
    try:
        time.sleep(0.2)
    finally:
        poller.stop()
    assert poller.stats.step_errors == 3
    assert poller.stats.busy_steps > 3
