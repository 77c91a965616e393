"""The P2P scheduler half's protocol on its own: what prefill returns, what decode pulls."""

import time
from dataclasses import dataclass, field
from enum import Enum

import pytest

from kvscope.connector.p2p.config import P2PConfig
from kvscope.connector.p2p.metadata import P2PWorkerMeta, done_notif, req_id_of_notif
from kvscope.connector.p2p.params import RemotePrefill
from kvscope.connector.p2p.scheduler import P2PScheduler

BLOCK = 32


class Status(Enum):
    FINISHED_LENGTH_CAPPED = 1
    FINISHED_ABORTED = 2


@dataclass
class Request:
    """The fields of vllm.v1.request.Request the scheduler half reads."""

    request_id: str
    num_prompt_tokens: int
    kv_transfer_params: dict | None = None
    num_computed_tokens: int = 0
    status: Status = Status.FINISHED_LENGTH_CAPPED
    extra: dict = field(default_factory=dict)


def prefilled(num_tokens: int = 100, block_ids=(7, 3, 9, 4)) -> tuple[P2PScheduler, dict]:
    prefill = P2PScheduler(P2PConfig(side_channel_port=6001, lease_timeout_s=20), "P", BLOCK)
    request = Request("p-1", num_tokens, {"do_remote_decode": True}, num_computed_tokens=num_tokens)
    keep, params = prefill.finished(request, (list(block_ids),))
    assert keep
    return prefill, params


def test_prefill_keeps_the_blocks_and_says_where_they_are():
    prefill, params = prefilled()
    remote = RemotePrefill.from_params(params)
    assert (remote.engine_id, remote.request_id, remote.port) == ("P", "p-1", 6001)
    assert remote.block_ids == ((7, 3, 9, 4),) and remote.num_tokens == 100
    assert params["kvscope_p2p_version"] == 1, "one group: the flat list of before"
    assert 19 < remote.lease_deadline_unix_s - time.time() <= 20
    assert [h.req_id for h in prefill.build_metadata().reqs_to_send] == ["p-1"]


def test_prefill_frees_at_once_when_aborted():
    prefill = P2PScheduler(P2PConfig(), "P", BLOCK)
    request = Request("p-2", 64, {"do_remote_decode": True}, 64, Status.FINISHED_ABORTED)
    assert prefill.finished(request, ([1, 2],)) == (False, None)


def test_decode_pulls_the_prompt_less_local_hits_and_the_last_token():
    _, params = prefilled()
    decode = P2PScheduler(P2PConfig(), "D", BLOCK)
    request = Request("d-1", 100, dict(params))
    assert decode.lookup(request, num_computed_tokens=32) == (99 - 32, True)
    decode.bind(request, ([10, 11, 12, 13],), 99 - 32)
    (pull,) = decode.build_metadata().reqs_to_recv
    assert pull.local_block_ids == ((11, 12, 13),) and pull.remote_block_ids == ((3, 9, 4),)
    assert decode.lookup(request, 32) == (0, False)  # one transfer per request
    assert decode.finished(request, ([10, 11, 12, 13],)) == (True, None)  # still being written
    decode.on_worker_output(P2PWorkerMeta(), set(), {"d-1"})
    assert decode.finished(request, ([10, 11, 12, 13],)) == (False, None)


def test_decode_with_every_block_local_releases_the_prefill_blocks():
    _, params = prefilled(num_tokens=40, block_ids=(5, 6))
    decode = P2PScheduler(P2PConfig(), "D", BLOCK)
    request = Request("d-2", 40, dict(params))
    assert decode.lookup(request, 32) == (39 - 32, True)
    decode.bind(request, ([1, 2],), 0)  # vLLM decided on no external tokens
    metadata = decode.build_metadata()
    assert not metadata.reqs_to_recv and [r.req_id for r in metadata.reqs_to_release] == ["d-2"]


@pytest.mark.parametrize(
    "change",
    [
        {"remote_block_size": 16},
        {"kvscope_p2p_version": 99},
        {"remote_block_ids": "1,2"},
        {"remote_port": -1},
        {"remote_engine_id": ""},
    ],
)
def test_decode_refuses_bad_or_mismatched_params_and_computes_instead(change):
    _, params = prefilled()
    decode = P2PScheduler(P2PConfig(), "D", BLOCK)
    assert decode.lookup(Request("d-3", 100, {**params, **change}), 0) == (0, False)
    assert not decode.build_metadata().reqs_to_recv


def test_expired_lease_is_told_apart_from_a_read():
    prefill, _ = prefilled()
    prefill.on_worker_output(P2PWorkerMeta(leases_expired={"p-1"}), {"p-1"}, set())
    assert prefill.stats["leases_expired"] == 1 and not prefill.held_for_readers


def test_notifications_name_the_prefill_request():
    assert req_id_of_notif(done_notif("cmpl-1-0")) == "cmpl-1-0"
    assert req_id_of_notif(b"something else") is None
