"""When the NIXL agent is progressed next: the transport's timeouts and polling pace."""

from dataclasses import dataclass


@dataclass(frozen=True)
class TransportConfig:
    """Timeouts and polling pace.

    The agent is polled only when there is something to progress: every `busy_interval_s`
    while our reads are in flight; while a peer's read of our blocks is expected, as fast for
    `fast_wait_s` (a read usually comes and ends within it, and UCX may need our progress to
    serve it: slower polls cut its bandwidth), then slower the longer nothing happens
    (`backoff_share` of the time waited beyond it, at most `max_backoff_interval_s`); and every
    `idle_interval_s` otherwise (None: only when woken), a heartbeat that also takes in stray
    notifications.
    """

    transfer_timeout_s: float = 30.0  # a hung peer leaves a READ in PROC forever without this
    busy_interval_s: float = 0.001
    fast_wait_s: float = 1.0
    backoff_share: float = 0.02
    max_backoff_interval_s: float = 0.01
    idle_interval_s: float | None = 1.0
    hot_after_activity_s: float = 0.05  # a notification we sent may still need progress
    unreleased_retry_s: float = 0.05


def next_poll_delay(
    cfg: TransportConfig,
    now: float,
    in_flight: bool,
    read_expected: bool,
    last_event: float,
    unreleased: bool,
) -> float | None:
    """Seconds until the next poller step (None: until woken), as TransportConfig says."""
    if in_flight:
        return cfg.busy_interval_s
    delay = cfg.idle_interval_s
    if read_expected:  # a peer should read our blocks: back off as nothing happens
        waited_s = max(now - last_event - cfg.fast_wait_s, 0.0)
        backoff = cfg.busy_interval_s + waited_s * cfg.backoff_share
        delay = min(backoff, cfg.max_backoff_interval_s)
    if unreleased:
        delay = min(delay or cfg.unreleased_retry_s, cfg.unreleased_retry_s)
    return delay
