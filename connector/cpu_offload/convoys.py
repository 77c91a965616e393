"""Load convoys: a request's load queued behind another request's load of the same host blocks.

What happens on a real engine (vLLM 0.32, the CPU platform, measured by
bench/engine/convoy_bursts.py): N requests that arrive together sharing a prefix held in the
host pool are each looked up in the same scheduler step, and vLLM holds none back. A request
loading asynchronously gets its blocks with caching delayed until its load ends, so the next
request finds nothing in vLLM's own prefix cache, asks the connector, and leases the same host
blocks: N leases, N load jobs of the same host blocks into N sets of device blocks, through the
one copy thread in submission order. The k-th request's copy waits for the k-1 before it (on the
mid model a 2k prefix is 64 blocks, 3-14 ms a copy: the 16th waited 76 ms), and each request
resumes only when its own copy ended. No request waits on another's load directly; it waits
behind it. A request that arrives after a load of its prefix ended hits vLLM's prefix cache
instead.

shared_loads.py now holds such requests back until the first load ends, so that one load
serves them all through vLLM's prefix cache: each waits on another request's load, and that
wait is recorded the same way (LoadConvoy.shared_load). kv_connector_extra_config
{"share_loads": false} brings back a load a request.
"""

from dataclasses import dataclass, replace

from kvscope.connector.cpu_offload.metadata import BlockTransfer


@dataclass(frozen=True)
class LoadConvoy:
    """A load that was submitted while earlier loads of some of its host blocks had not ended,
    or (shared_load) a request held back until another request's load of its blocks ended."""

    req_id: str
    leader_req_id: str  # the request of the first of those loads
    loads_ahead: int  # how many of them had not ended when this one was submitted
    shared_blocks: int  # this load's host blocks that those loads also read
    submitted_at: float  # time.monotonic(): the wait began (shared: the first lookup held)
    copy_started_at: float = 0.0  # its own copy began (shared: it was asked again and went on)
    shared_load: bool = False  # the leader's load served it: no copy of its own

    def ended(self, at: float) -> "LoadConvoy":
        """A shared load's wait, ended now."""
        return replace(self, copy_started_at=at, shared_load=True)


@dataclass
class _Load:
    req_id: str
    host_block_ids: frozenset[int]
    ahead: tuple[int, ...] = ()  # job ids of earlier loads sharing host blocks
    finished_at: float | None = None


class LoadConvoys:
    """Follows the worker's loads in flight and tells, as each ends, whether it was a convoy.

    Holds only loads not yet ended and ended ones a later load still queued behind: bounded by
    the loads in flight. Costs a set intersection per load in flight on each submission.
    """

    def __init__(self) -> None:
        self._loads: dict[int, _Load] = {}

    def submitted(self, job_id: int, transfer: BlockTransfer) -> None:
        host_blocks = frozenset(transfer.host_block_ids)
        ahead = tuple(
            other_id
            for other_id, other in self._loads.items()
            if other.finished_at is None
            and other.req_id != transfer.req_id
            and not other.host_block_ids.isdisjoint(host_blocks)
        )
        self._loads[job_id] = _Load(transfer.req_id, host_blocks, ahead)

    def finished(
        self, job_id: int, submitted_at: float, copy_started_at: float, finished_at: float
    ) -> LoadConvoy | None:
        """The load's convoy, if some earlier load of its blocks was still queued or copying
        when it was submitted (its copy then ended after that submission)."""
        load = self._loads.get(job_id)
        if load is None:
            return None
        load.finished_at = finished_at
        waited_behind = [
            other
            for other_id in load.ahead
            if (other := self._loads.get(other_id)) is not None
            and (other.finished_at is None or other.finished_at > submitted_at)
        ]
        convoy = None
        if waited_behind:
            shared = frozenset().union(*(other.host_block_ids for other in waited_behind))
            convoy = LoadConvoy(
                load.req_id,
                waited_behind[0].req_id,
                len(waited_behind),
                len(load.host_block_ids & shared),
                submitted_at,
                copy_started_at,
            )
        self._forget_ended()
        return convoy

    def dropped(self, job_id: int) -> None:
        """A load that will never report (cancelled before it copied)."""
        if (load := self._loads.get(job_id)) is not None:
            load.finished_at = float("-inf")
        self._forget_ended()

    def _forget_ended(self) -> None:
        waiting = (load for load in self._loads.values() if load.finished_at is None)
        needed = {other_id for load in waiting for other_id in load.ahead}
        for job_id in [
            job_id
            for job_id, load in self._loads.items()
            if load.finished_at is not None and job_id not in needed
        ]:
            del self._loads[job_id]

    def __len__(self) -> int:
        return len(self._loads)
