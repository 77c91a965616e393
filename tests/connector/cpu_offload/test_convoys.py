"""Load convoys: a load is one only while an earlier load of its host blocks had not ended."""

from kvscope.connector.cpu_offload.convoys import LoadConvoys
from kvscope.connector.cpu_offload.metadata import BlockTransfer


def load(req_id: str, host_block_ids: tuple[int, ...], lease_id: int = 1) -> BlockTransfer:
    return BlockTransfer(req_id, tuple(range(len(host_block_ids))), host_block_ids, lease_id)


def test_a_load_behind_loads_of_the_same_blocks_is_a_convoy_with_its_first_leader():
    convoys = LoadConvoys()
    convoys.submitted(1, load("r1", (0, 1, 2)))
    convoys.submitted(2, load("r2", (0, 1, 2, 3)))
    convoys.submitted(3, load("r3", (2, 3)))
    assert convoys.finished(1, 0.0, 0.0, 1.0) is None
    second = convoys.finished(2, 0.1, 1.0, 2.0)
    assert (second.req_id, second.leader_req_id, second.loads_ahead) == ("r2", "r1", 1)
    assert second.shared_blocks == 3 and second.copy_started_at - second.submitted_at == 0.9
    third = convoys.finished(3, 0.2, 2.0, 3.0)
    assert (third.leader_req_id, third.loads_ahead, third.shared_blocks) == ("r1", 2, 2)
    assert len(convoys) == 0  # nothing kept once every load ended


def test_other_blocks_an_ended_load_or_the_same_request_make_no_convoy():
    convoys = LoadConvoys()
    convoys.submitted(1, load("r1", (0, 1)))
    convoys.submitted(2, load("r2", (5, 6)))  # other blocks
    convoys.submitted(3, load("r1", (0, 1)))  # the same request again
    assert convoys.finished(1, 0.0, 0.0, 0.5) is None
    assert convoys.finished(2, 0.0, 0.5, 0.6) is None
    assert convoys.finished(3, 0.0, 0.6, 0.7) is None
    # Submitted while the earlier copy was unreported but already over: no wait behind it.
    convoys.submitted(4, load("r4", (0, 1)))
    convoys.submitted(5, load("r5", (0, 1)))
    assert convoys.finished(4, 1.0, 1.0, 1.1) is None
    assert convoys.finished(5, 1.2, 1.2, 1.3) is None
    assert len(convoys) == 0


def test_a_load_dropped_before_it_copied_leads_no_convoy_and_is_forgotten():
    convoys = LoadConvoys()
    convoys.submitted(1, load("r1", (0, 1)))
    convoys.submitted(2, load("r2", (0, 1)))
    convoys.dropped(1)
    assert convoys.finished(2, 0.0, 0.0, 0.1) is None
    assert len(convoys) == 0
