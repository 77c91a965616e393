"""P2P under vLLM's hybrid KV cache manager: two engines' real Schedulers over two KV cache
groups (full attention + a 64-token sliding window), worker halves doing real NIXL READs."""

import pytest
import torch
from vllm import SamplingParams
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole, supports_hma
from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, KVCacheGroupSpec
from vllm.v1.request import Request, RequestStatus

from kvscope.connector.p2p.connector import P2PConnector
from kvscope.connector.p2p.core import P2PCore
from kvscope.connector.p2p.metadata import P2PMetadata
from kvscope.connector.p2p.params import RemotePrefill
from kvscope.traces import names
from tests.connector.cpu_offload.hma_harness import (
    BLOCK,
    HASHER,
    NUM_BLOCKS,
    NUM_LAYERS,
    block_value,
    kv_cache_config,
)
from tests.connector.p2p.hma_pair import Side, p2p_vllm_config, pump, recved


def prompt(start: int, num_tokens: int = 6 * BLOCK + 5) -> list[int]:
    """A prompt no other test shares a prefix with (T = 197: 6 full blocks, a partial one)."""
    return list(range(start, start + num_tokens))


FULL, SWA = 0, 1
# The prefill side holds sliding-window blocks from (197 - 64 + 1) // 32 = 4; the decode side
# pulls 196 tokens and attends from (196 - 64 + 1) // 32 = 4: blocks 4-6, none before.
WINDOW_INDICES = (4, 5, 6)


def request(req_id: str, prompt: list[int], params: dict, max_tokens: int) -> Request:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    sampling.extra_args = {"kv_transfer_params": params}
    return Request(req_id, prompt, sampling, None, block_hasher=HASHER)


@pytest.fixture(scope="module")
def pair(tiny_model):
    """A prefill side and a decode side; the decode side ran a local request first, so that
    its block ids differ from the prefill side's."""
    prefill, decode = Side(tiny_model, "prefill", +1), Side(tiny_model, "decode", -1)
    decode.scheduler.add_request(request("warm", list(range(9000, 9100)), {}, 2))
    pump([decode], lambda: not decode.scheduler.has_unfinished_requests())
    yield prefill, decode
    decode.close()
    prefill.close()


def prefilled(prefill: Side, req_id: str, tokens: list[int]) -> dict:
    """Prefill one request for a remote decode; returns the kv_transfer_params it returned."""
    prefill.scheduler.add_request(request(req_id, tokens, {"do_remote_decode": True}, 1))
    pump([prefill], lambda: req_id in prefill.params)
    return prefill.params[req_id]


@pytest.fixture(scope="module")
def first(pair) -> dict:
    """Request p-1 prefilled (the first test looks at it held, the second reads it)."""
    return prefilled(pair[0], "p-1", prompt(100))


def pulls_of(decode: Side) -> list:
    metadata = [getattr(meta, "inner", meta) for meta in decode.metadata]  # TracedMetadata
    return [
        pull for meta in metadata if isinstance(meta, P2PMetadata) for pull in meta.reqs_to_recv
    ]


def test_the_p2p_connector_is_supports_hma():
    assert supports_hma(P2PConnector) and supports_hma(P2PCore)


def test_prefill_returns_each_groups_blocks_and_holds_them(pair, first):
    prefill, params = pair[0], first
    held = prefill.p2p.held_for_readers["p-1"]
    assert params["kvscope_p2p_version"] == 2 and params["remote_num_blocks"] == 7
    full, window = params["remote_block_ids"]
    assert len(full) == 7, "full attention: the whole prefix"
    assert len(window) == len(WINDOW_INDICES), "sliding window: only the window's blocks"
    null = prefill.scheduler.kv_cache_manager.block_pool.null_block.block_id
    assert null not in full + window and held.block_ids == (tuple(full), tuple(window))
    assert prefill.free_blocks() == NUM_BLOCKS - 1 - 7 - 3, "vLLM keeps the held blocks"


def test_decode_reads_the_full_prefix_and_only_the_window(pair, first, spans):
    (prefill, decode), params = pair, first
    decode.scheduler.add_request(request("d-1", prompt(100), dict(params), 3))
    pump([prefill, decode], lambda: recved(decode, "d-1"))
    (pull,) = [p for p in pulls_of(decode) if p.req_id == "d-1"]
    full_ids, swa_ids = decode.block_ids("d-1")
    assert pull.local_block_ids == (tuple(full_ids[:7]), tuple(swa_ids[i] for i in WINDOW_INDICES))
    assert pull.remote_block_ids == tuple(tuple(g) for g in params["remote_block_ids"])
    assert set(full_ids) & set(swa_ids) == set(), "block ids of two groups never overlap here"
    for layer in range(NUM_LAYERS):  # the prefill side's KV (positive), each in its group
        for index in range(7):
            assert decode.read(FULL, full_ids[index], layer) == block_value(FULL, index, layer)
        for index in WINDOW_INDICES:
            assert decode.read(SWA, swa_ids[index], layer) == block_value(SWA, index, layer)
    null = decode.scheduler.kv_cache_manager.block_pool.null_block.block_id
    assert all(swa_ids[i] == null for i in range(4)), "vLLM's null block before the window"
    assert not any(view[null].any() for view in decode.kv_caches.values()), "null written"
    [read] = [
        s
        for s in spans()
        if s.name == names.SPAN_TRANSFER
        and s.attributes.get(names.TRANSFER_DIRECTION) == "p2p_read"
    ]
    assert list(read.attributes[names.KV_CACHE_GROUP_IDS]) == [0] * 7 + [1] * 3
    assert list(read.attributes[names.BLOCK_IDS]) == list(pull.flat_local)
    assert read.attributes[names.TRANSFER_BYTES] == 10 * NUM_LAYERS * _page_bytes(decode)
    full, window = params["remote_block_ids"]
    pump(
        [prefill, decode],
        lambda: (
            not decode.scheduler.has_unfinished_requests()
            and "p-1" not in prefill.p2p.held_for_readers
        ),
    )
    assert decode.scheduler.requests == {} and decode.p2p.pulling == set()
    [released] = [
        e
        for span in spans()
        for e in span.events
        if e.name == names.EVENT_LEASE_RELEASED and e.attributes[names.LEASE_HOLDER] == "p-1"
    ]
    assert list(released.attributes[names.KV_CACHE_GROUP_IDS]) == [0] * 7 + [1] * 3
    assert list(released.attributes[names.BLOCK_IDS]) == full + window


def test_the_prefill_side_frees_every_groups_blocks_once_read(pair):
    prefill, decode = pair
    pump([prefill, decode], lambda: not prefill.p2p.held_for_readers, timeout_s=40)
    assert prefill.free_blocks() == NUM_BLOCKS - 1, "every block but the null one is free"
    assert prefill.scheduler.requests == {}


def test_blocks_the_decode_side_has_in_every_group_are_not_pulled(pair):
    prefill, decode = pair
    decode.scheduler.add_request(request("local", prompt(5000, 4 * BLOCK + 10), {}, 2))
    pump([decode], lambda: not decode.scheduler.has_unfinished_requests())
    params = prefilled(prefill, "p-part", prompt(5000))
    decode.scheduler.add_request(request("d-part", prompt(5000), dict(params), 2))
    pump([prefill, decode], lambda: recved(decode, "d-part"))
    (pull,) = [p for p in pulls_of(decode) if p.req_id == "d-part"]
    full, window = params["remote_block_ids"]
    assert pull.remote_block_ids == (tuple(full[4:]), tuple(window)), "blocks 0-3 were local"
    full_ids, swa_ids = decode.block_ids("d-part")
    assert pull.local_block_ids == (tuple(full_ids[4:7]), tuple(swa_ids[4:7]))
    for index in (4, 5, 6):
        assert decode.read(FULL, full_ids[index]) == block_value(FULL, index, 0)
        assert decode.read(SWA, swa_ids[index]) == block_value(SWA, index, 0)
    assert decode.read(FULL, full_ids[0]) == -block_value(FULL, 0, 0), "the local KV stayed"
    pump(
        [prefill, decode],
        lambda: not decode.scheduler.has_unfinished_requests() and not prefill.p2p.held_for_readers,
    )


def test_a_failed_read_is_reported_through_failed_recving(pair):
    prefill, decode = pair
    params = prefilled(prefill, "p-bad", prompt(1000))
    full, window = params["remote_block_ids"]
    bad = {**params, "remote_block_ids": [full, [b + 10_000 for b in window]]}
    decode.scheduler.add_request(req := request("d-bad", prompt(1000), bad, 2))
    pump([prefill, decode], lambda: recved(decode, "d-bad"))
    output = decode.outputs[-1]
    assert output.failed_recving == {"d-bad"}
    assert output.invalid_block_ids == set(), "block ids are per group: vLLM refuses them"
    decode.step()
    assert req.status is RequestStatus.RUNNING and req.num_computed_tokens == len(prompt(1000))
    pump(
        [prefill, decode],
        lambda: not decode.scheduler.has_unfinished_requests() and not prefill.p2p.held_for_readers,
    )
    assert prefill.free_blocks() == NUM_BLOCKS - 1, "the failed reader released them"


def test_a_failed_read_under_the_fail_policy_fails_the_request(pair, tiny_model):
    prefill, _ = pair
    decode = Side(tiny_model, "decode-fail", -1, policy="fail")
    try:
        params = prefilled(prefill, "p-fail", prompt(4000))
        full, window = params["remote_block_ids"]
        bad = {**params, "remote_block_ids": [[b + 10_000 for b in full], window]}
        decode.scheduler.add_request(req := request("d-fail", prompt(4000), bad, 2))
        pump([prefill, decode], lambda: recved(decode, "d-fail"))
        assert decode.outputs[-1].failed_recving == {"d-fail"}
        assert req.status is RequestStatus.FINISHED_ERROR
        pump([prefill, decode], lambda: not prefill.p2p.held_for_readers)
        assert decode.free_blocks() == NUM_BLOCKS - 1
    finally:
        decode.close()


def test_a_window_the_prefill_side_no_longer_holds_is_computed_here(pair):
    prefill, decode = pair
    tokens = prompt(2000, 63 + 4 * BLOCK)  # T = 191: held from 128 // 32 = 4, needed from 3
    params = prefilled(prefill, "p-edge", tokens)
    decode.scheduler.add_request(req := request("d-edge", tokens, dict(params), 2))
    decode.step()
    assert req.status is RequestStatus.RUNNING and not decode.p2p.pulling
    pump(
        [prefill, decode],
        lambda: not decode.scheduler.has_unfinished_requests() and not prefill.p2p.held_for_readers,
    )
    assert prefill.free_blocks() == NUM_BLOCKS - 1, "released without a read"


def test_two_group_params_at_a_one_group_engine_are_refused(pair, tiny_model):
    prefill, _ = pair
    params = prefilled(prefill, "p-one", prompt(3000))
    config = p2p_vllm_config(tiny_model, "one", 5999, "recompute")
    one = P2PConnector(config, KVConnectorRole.SCHEDULER, kv_cache_config(("full",)))
    req = request("d-one", prompt(3000), dict(params), 2)
    assert one.get_num_new_matched_tokens(req, 0) == (0, False)
    assert [r.req_id for r in one.inner.scheduler.build_metadata().reqs_to_release] == ["d-one"]


def test_a_group_p2p_cannot_move_refuses_to_start(tiny_model):
    config = kv_cache_config()
    local = ChunkedLocalAttentionSpec(
        BLOCK, num_kv_heads=2, head_size=32, dtype=torch.bfloat16, attention_chunk_size=64
    )
    config.kv_cache_groups[1] = KVCacheGroupSpec(["local.0", "local.1"], local)
    vllm_config = p2p_vllm_config(tiny_model, "x", 5998, "recompute")
    with pytest.raises(ValueError, match="ChunkedLocalAttentionSpec.*hybrid-kv-cache-manager"):
        P2PConnector(vllm_config, KVConnectorRole.SCHEDULER, config)


def _page_bytes(side: Side) -> int:
    view = next(iter(side.kv_caches.values()))
    return view[0].numel() * view.element_size()


def test_one_group_params_as_before_are_accepted(first):
    one = {**first, "kvscope_p2p_version": 1, "remote_block_ids": [4, 5]}
    del one["remote_num_blocks"]
    remote = RemotePrefill.from_params(one)
    assert remote.block_ids == ((4, 5),) and remote.num_blocks == 2
    ours = RemotePrefill.from_params(first).to_params()
    assert ours == {k: v for k, v in first.items() if k in ours}, "vLLM adds its own keys"


def test_params_of_a_kvscope_that_never_re_registers_name_registration_0(first):
    older = {k: v for k, v in first.items() if k != "remote_registration"}
    assert RemotePrefill.from_params(older).registration == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"remote_block_ids": [1, 2]}, r"remote_block_ids\[0\] must be a list"),
        ({"remote_block_ids": []}, "list of 1 to 64 lists"),
        ({"remote_block_ids": [[1], "2"]}, r"remote_block_ids\[1\] must be a list"),
        ({"remote_block_ids": [[1], [-2]]}, r"remote_block_ids\[1\] entries must be"),
        ({"remote_block_ids": [[1]] * 65}, "list of 1 to 64 lists"),
        ({"remote_num_blocks": 2}, "longer than remote_num_blocks"),
        ({"remote_num_blocks": None}, "remote_num_blocks must be an integer"),
        ({"kvscope_p2p_version": 3}, "neither 1 nor 2: run the same kvscope version"),
        ({"remote_registration": -1}, r"remote_registration must be an integer in \[0, "),
        ({"remote_registration": "1"}, "remote_registration must be an integer"),
    ],
)
def test_bad_two_group_params_are_refused_with_the_reason(first, change, message):
    with pytest.raises(ValueError, match=message):
        RemotePrefill.from_params({**first, **change})
