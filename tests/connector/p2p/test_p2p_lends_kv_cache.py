"""P2P while vLLM lends the KV cache away (0.33's sleep, 0.34's weight updates), on two engines'
real Schedulers with worker halves doing real NIXL READs.

vLLM resets the connector (a pause that clears the cache), calls unregister_kv_caches, frees the
memory and calls restore_kv_caches once it is back (`kv_cache_lent_for_weight_update`, the
worker's sleep and wake_up). A prefill side then revokes what it lent and serves a new
registration; leases made afterwards name it, so a decode side handshakes again before it reads,
and refuses a lease made before it. A decode side that lent its own cache handshakes again too.
"""

import pytest

from kvscope.connector.p2p.core import P2PCore
from kvscope.connector.p2p.transport.side_channel import SideChannelError, fetch_peer_info
from tests.connector.cpu_offload.hma_harness import NUM_BLOCKS, block_value
from tests.connector.p2p.hma_pair import Side, pump, recved
from tests.connector.p2p.test_p2p_hma import FULL, SWA, WINDOW_INDICES, prefilled, prompt, request


@pytest.fixture(scope="module")
def pair(tiny_model):
    prefill, decode = Side(tiny_model, "lender", +1), Side(tiny_model, "borrower", -1)
    yield prefill, decode
    decode.close()
    prefill.close()


def core(side: Side) -> P2PCore:
    return side.worker.inner


def handshakes(decode: Side) -> int:
    return core(decode).worker.puller.stats.handshakes


def read_all(pair, req_id: str, params: dict, tokens: list[int]) -> None:
    """A decode request over these params until it received (or failed) and both sides idle."""
    prefill, decode = pair
    decode.scheduler.add_request(request(req_id, tokens, dict(params), 2))
    pump([prefill, decode], lambda: recved(decode, req_id))


def drain(pair) -> None:
    prefill, decode = pair
    pump(
        [prefill, decode],
        lambda: not decode.scheduler.has_unfinished_requests() and not prefill.p2p.held_for_readers,
    )


def assert_pulled(decode: Side, req_id: str) -> None:
    """The decode side holds the prefill side's KV (positive values; its own are negative)."""
    full_ids, swa_ids = decode.block_ids(req_id)
    for index in range(6):
        assert decode.read(FULL, full_ids[index]) == block_value(FULL, index, 0), index
    for index in WINDOW_INDICES:
        assert decode.read(SWA, swa_ids[index]) == block_value(SWA, index, 0), index


def lend_away(side: Side, reset: bool = True) -> None:
    """What vLLM does around a weight update that borrows the KV cache's memory."""
    if reset:
        assert side.scheduler.reset_prefix_cache(reset_running_requests=True, reset_connector=True)
    side.worker.unregister_kv_caches()
    for layer in side.kv_caches.values():
        layer.zero_()  # the memory went to the weights: what it held is gone
    side.worker.restore_kv_caches()


def test_a_weight_update_on_the_prefill_side_makes_readers_handshake_again(pair):
    prefill, decode = pair
    read_all(pair, "d-before", prefilled(prefill, "p-before", prompt(100)), prompt(100))
    assert_pulled(decode, "d-before")
    drain(pair)
    assert handshakes(decode) == 1 and prefill.p2p.registration == 0

    lend_away(prefill)
    params = prefilled(prefill, "p-after", prompt(3000))
    assert params["remote_registration"] == 1
    read_all(pair, "d-after", params, prompt(3000))
    assert decode.outputs[-1].failed_recving == set()
    assert_pulled(decode, "d-after")
    assert handshakes(decode) == 2, "the decode side read the new registration without loading it"
    drain(pair)


def test_a_lease_outliving_the_loan_is_revoked_and_refused(pair):
    """Sleep at level 0 keeps the scheduler's state: a lease may still be held."""
    prefill, decode = pair
    stale = prefilled(prefill, "p-stale", prompt(6000))
    assert prefill.p2p.held_for_readers.keys() == {"p-stale"}
    prefill.scheduler.connector.reset_cache()
    lend_away(prefill, reset=False)
    pump([prefill], lambda: not prefill.p2p.held_for_readers)
    assert prefill.free_blocks() == NUM_BLOCKS - 1, "the revoked lease's blocks were freed"

    fresh = prefilled(prefill, "p-fresh", prompt(7000))
    read_all(pair, "d-fresh", fresh, prompt(7000))  # loads the new registration
    assert_pulled(decode, "d-fresh")
    read_all(pair, "d-stale", stale, prompt(6000))
    assert decode.outputs[-1].failed_recving == {"d-stale"}, "a revoked lease was read"
    drain(pair)


def test_the_side_channel_refuses_handshakes_while_the_cache_is_lent(pair):
    prefill, _ = pair
    port = prefill.config.kv_transfer_config.kv_connector_extra_config["side_channel_port"]
    before = fetch_peer_info("127.0.0.1", port, timeout_s=5).registration
    prefill.scheduler.connector.reset_cache()
    prefill.worker.unregister_kv_caches()
    try:
        with pytest.raises(SideChannelError, match="lent away"):
            fetch_peer_info("127.0.0.1", port, timeout_s=5)
    finally:
        prefill.worker.restore_kv_caches()
    assert fetch_peer_info("127.0.0.1", port, timeout_s=5).registration == before + 1


def test_a_decode_side_that_lent_its_own_cache_reads_again_after_a_new_handshake(pair):
    prefill, decode = pair
    known = handshakes(decode)
    lend_away(decode)
    read_all(pair, "d-back", prefilled(prefill, "p-back", prompt(9000)), prompt(9000))
    assert decode.outputs[-1].failed_recving == set()
    assert_pulled(decode, "d-back")
    assert handshakes(decode) == known + 1
    drain(pair)


def test_a_registration_no_reset_announced_revokes_the_leases_of_one_step(pair):
    """vLLM 0.34 announces every loan (a reset before a weight update or a sleep that clears
    the cache, handshake metadata again at wake-up). Unannounced, the scheduler hears of the new
    registration one step late: the leases it made until then are revoked (their readers
    recompute), and the next ones name the new registration."""
    prefill, decode = pair
    known = handshakes(decode)
    lend_away(prefill, reset=False)
    expired = prefill.p2p.stats.leases_expired
    early = prefilled(prefill, "p-early", prompt(11000))
    pump([prefill], lambda: not prefill.p2p.held_for_readers, timeout_s=5)  # not at its deadline
    assert prefill.p2p.stats.leases_expired == expired + 1
    late = prefilled(prefill, "p-late", prompt(12000))
    assert late["remote_registration"] > early["remote_registration"]
    read_all(pair, "d-late", late, prompt(12000))
    assert decode.outputs[-1].failed_recving == set()
    assert_pulled(decode, "d-late")
    assert handshakes(decode) == known + 1
    drain(pair)
