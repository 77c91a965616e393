"""The KV-event ledger over batches encoded and decoded as vLLM's publisher and a subscriber do:
stores and removals per tier, gaps, a publisher restart, and the settings' endpoint list."""

import msgspec
import pytest
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

from kvscope.backend.kv_events.ledger import EventLedger
from kvscope.backend.kv_events.subscriber import parse_endpoints

URL = "tcp://127.0.0.1:5557"


def wire(*events) -> KVEventBatch:
    batch = KVEventBatch(ts=0.0, events=list(events))
    return msgspec.msgpack.decode(msgspec.msgpack.encode(batch), type=KVEventBatch)


def stored(hashes: list[int], medium: str) -> BlockStored:
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=[1] * 32 * len(hashes),
        block_size=32,
        lora_id=None,
        medium=medium,
        lora_name=None,
    )


def test_stores_removals_gaps_and_a_restart():
    ledger = EventLedger({URL: "engine-a"})
    ledger.record(URL, 0, wire(stored([1, 2, 3], "GPU"), stored([1, 2], "CPU")))
    ledger.record(URL, 1, wire(BlockRemoved(block_hashes=[2], medium="CPU")))
    (state,) = ledger.snapshot()
    assert state.claimed == {("device", 0): {1, 2, 3}, ("host", 0): {1}}
    assert state.missed_batches == 0 and state.gaps == []

    ledger.record(URL, 4, wire(AllBlocksCleared()))  # seqs 2 and 3 never arrived
    (state,) = ledger.snapshot()
    assert [(g.first_seq, g.last_seq, g.why) for g in state.gaps] == [(2, 3, "not received")]
    assert state.missed_batches == 2
    assert state.claimed == {("host", 0): {1}}  # a prefix-cache reset clears the GPU tier only

    ledger.record(URL, 1, wire(stored([9], "CPU")))  # the publisher restarted, seq 0 missed
    (state,) = ledger.snapshot()
    assert state.restarts == 1 and state.claimed == {("host", 0): {9}}
    assert state.gaps[-1].first_seq == 0 and state.gaps[-1].last_seq == 0
    assert state.missed_batches == 3 and state.batches == 4


def test_a_late_subscriber_counts_what_it_missed():
    ledger = EventLedger({URL: None})
    ledger.record(URL, 7, wire(stored([5], "CPU")))
    (state,) = ledger.snapshot()
    assert state.missed_batches == 7
    assert state.gaps[0].why == "published before the subscriber connected"


def test_endpoints_setting():
    assert parse_endpoints("prefill=tcp://h:1, tcp://h:2,") == {
        "tcp://h:1": "prefill",
        "tcp://h:2": None,
    }
    with pytest.raises(ValueError, match="is not"):
        parse_endpoints("h:1")
