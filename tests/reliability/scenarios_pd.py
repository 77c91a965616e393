"""Prefill/decode faults: the prefill peer hangs, dies, outlives its lease or sends bad ids."""

import time

from tests.reliability import scenarios
from tests.reliability.cases import CASES
from tests.reliability.engine_ops import Batch, connector_core, run
from tests.reliability.leaks import knows_peer
from tests.reliability.record import PREEMPTED_LEASE_S
from tests.reliability.scenarios import Cell


def prefill(cell: Cell, peer=None, lease_s: float | None = None) -> list[dict]:
    """kv_transfer_params for the cell's prompts, from a prefill peer."""
    tag = f"{cell.case.id}-pre"
    return (peer or cell.peer).prefill(cell.case.prompts(), tag, lease_s=lease_s)


def warm_up(cell: Cell, peer) -> None:
    """One healthy pull from peer (not measured): the decode side then holds a connection."""
    prompt = [f"[warm-up for {cell.case.id}] " + cell.case.prompts()[0]]
    params = peer.prefill(prompt, f"{cell.case.id}-warm")
    run(cell.llm, [f"{cell.case.id}-warm-0"], prompt, 4, kv_params=params)


def pulled(cell: Cell) -> Batch:
    """The healthy path: prefill on the peer, decode pulls the blocks."""
    return cell.run(kv_params=prefill(cell))


def peer_hangs(cell: Cell) -> Batch:
    """The prefill process is stopped (SIGSTOP: alive, sockets open, silent) when the decode
    side first contacts it: the handshake must time out."""
    params = prefill(cell)
    assert not knows_peer(cell.llm, params[0]["remote_engine_id"]), (
        "peer_hangs must be the first cell on its engine to meet the peer: run cases in order"
    )
    cell.peer.pause()
    try:
        return cell.run(kv_params=params)
    finally:
        cell.peer.resume()


def unusable_blocks(cell: Cell) -> Batch:
    """The read fails: block ids beyond the prefill side's KV cache (a corrupted message)."""
    params = prefill(cell)
    bad = [{**p, "remote_block_ids": [b + 100_000 for b in p["remote_block_ids"]]} for p in params]
    return cell.run(kv_params=bad)


def lease_expires(cell: Cell) -> Batch:
    """The decode side comes after the prefill side's lease ended: it must not read."""
    warm_up(cell, cell.peer)
    params = prefill(cell)
    time.sleep(max(params[-1]["remote_lease_deadline_unix_s"] - time.time(), 0) + 0.3)
    return cell.run(kv_params=params)


def peer_killed(cell: Cell) -> Batch:
    """The prefill process is killed (SIGKILL) after prefilling. The first such cell kills the
    victim while the decode side holds a connection to it (so the read fails); the victim
    prefilled every peer_killed cell's prompts first, and later cells find it dead."""
    victim = cell.victim
    if victim.alive:
        victim.wait_ready()
        warm_up(cell, victim)
        victim.stash = {
            case.id: victim.prefill(case.prompts(), f"{case.id}-pre")
            for case in CASES
            if case.fault == "peer_killed"
        }
        victim.kill()
    return cell.run(kv_params=victim.stash[cell.case.id])


def aborted(cell: Cell) -> Batch:
    """The first request is aborted during its transfer: the prefill process is stopped while
    the decode side's first handshake with it is in flight, and let go after the abort."""
    params = prefill(cell)
    assert not knows_peer(cell.llm, params[0]["remote_engine_id"]), (
        "aborted must meet the peer first (only peer_hangs, which never connects, may come"
        " before it): run cases in order"
    )
    p2p = connector_core(cell.llm, "P2PCore").scheduler
    first, done = cell.ids()[0], []

    def abort_when() -> list[str]:
        if done:
            cell.peer.resume()  # the abort is in: now the handshake may answer
            return []
        if any(req_id.startswith(first + "-") for req_id in p2p.pulling):
            done.append(first)
        return list(done)

    cell.peer.pause()
    try:
        return cell.run(kv_params=params, abort_when=abort_when)
    finally:
        cell.peer.resume()


def preempted(cell: Cell) -> Batch:
    """The preempted requests read late (after others free KV blocks): a longer lease."""
    return scenarios.preempted(cell, kv_params=prefill(cell, lease_s=PREEMPTED_LEASE_S))


def p2p_fails_offload_serves(cell: Cell) -> Batch:
    """The Multi: the P2P read fails, the offload child holds (part of) the same prefix."""
    cell.store_then_forget()
    return unusable_blocks(cell)


def offload_child_fails(cell: Cell) -> Batch:
    """The Multi: the offload child's load fails; no other child has the blocks."""
    cell.store_then_forget()
    return cell.with_faults({"fail_load_every": 1}, cell.run)


def offload_child_slow(cell: Cell) -> Batch:
    cell.store_then_forget()
    return cell.with_faults({"load_delay_ms": 5000.0}, cell.run)


SCENARIOS = {
    "peer_hangs": peer_hangs,
    "load_fails": unusable_blocks,
    "lease_expires": lease_expires,
    "peer_killed": peer_killed,
    "aborted": aborted,
    "preempted": preempted,
    "backend_down": lambda cell: scenarios.backend_down(cell, lambda: pulled(cell)),
    "queue_full": lambda cell: scenarios.queue_full(cell, lambda: pulled(cell)),
}
"""P2P alone; the Multi uses these too, with MULTI_ONLY on top."""

MULTI_ONLY = {
    "load_fails": offload_child_fails,
    "p2p_fails_offload_has_whole": p2p_fails_offload_serves,
    "p2p_fails_offload_has_part": p2p_fails_offload_serves,
    "load_slow": offload_child_slow,
}
