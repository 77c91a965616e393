"""Fault plans: which loads fail, delays, runtime changes through set_plan and a JSON file."""

import json
import os

import pytest

from kvscope.connector.cpu_offload.faults import FaultInjector, FaultPlan


def failures(injector: FaultInjector, req_ids: list[str]) -> list[bool]:
    return [injector.on_load(req_id).fail_reason is not None for req_id in req_ids]


def test_the_default_plan_injects_nothing():
    injector = FaultInjector()
    assert not any(injector.on_load(f"req-{n}").any for n in range(50))


def test_every_nth_load_fails():
    injector = FaultInjector(FaultPlan(fail_load_every=3))
    assert failures(injector, ["r"] * 7) == [False, False, True, False, False, True, False]
    assert injector.counters.failures_injected == 2


def test_loads_of_matching_request_ids_fail():
    injector = FaultInjector(FaultPlan(fail_load_req_prefix="bad-"))
    assert failures(injector, ["bad-1", "good-1", "bad-2", "xbad-"]) == [True, False, True, False]
    assert "bad-" in injector.on_load("bad-3").fail_reason


def test_seeded_probability_repeats_exactly_and_has_the_right_rate():
    req_ids = [f"req-{n}" for n in range(400)]
    first = failures(FaultInjector(FaultPlan(fail_load_probability=0.25, seed=7)), req_ids)
    again = failures(FaultInjector(FaultPlan(fail_load_probability=0.25, seed=7)), req_ids)
    other_seed = failures(FaultInjector(FaultPlan(fail_load_probability=0.25, seed=8)), req_ids)
    assert first == again
    assert first != other_seed
    assert 60 < sum(first) < 140


def test_delay_and_lease_attack_are_reported_per_load():
    fault = FaultInjector(FaultPlan(load_delay_ms=40, evict_leased=True)).on_load("r")
    assert (fault.fail_reason, fault.delay_s, fault.evict_leased) == (None, 0.04, True)


def test_set_plan_at_runtime_restarts_the_sequence():
    injector = FaultInjector(FaultPlan(fail_load_every=2))
    failures(injector, ["r"])
    injector.set_plan({"fail_load_every": 2})
    assert failures(injector, ["r", "r"]) == [False, True]
    injector.set_plan(FaultPlan())
    assert failures(injector, ["r", "r"]) == [False, False]


def test_plan_from_kv_connector_extra_config(tmp_path):
    plan_path = tmp_path / "faults.json"
    extra_config = {"faults": {"fail_load_every": 2, "seed": 3}, "faults_path": str(plan_path)}
    injector = FaultInjector.from_extra_config(extra_config)
    assert injector.plan == FaultPlan(fail_load_every=2, seed=3)  # no file yet: dict plan holds
    assert FaultInjector.from_extra_config(None).plan == FaultPlan()


def test_plan_file_is_reread_when_it_changes(tmp_path):
    plan_path = tmp_path / "faults.json"
    plan_path.write_text(json.dumps({"fail_load_req_prefix": "a"}))
    injector = FaultInjector(plan_path=plan_path)
    assert failures(injector, ["a1", "b1"]) == [True, False]
    plan_path.write_text(json.dumps({"fail_load_req_prefix": "bb"}))
    os.utime(plan_path, ns=(1, 10**18))  # a new mtime even on coarse filesystem clocks
    assert failures(injector, ["a1", "bb1"]) == [False, True]
    assert injector.counters.plan_reloads == 2


def test_a_broken_plan_file_keeps_the_current_plan(tmp_path):
    plan_path = tmp_path / "faults.json"
    plan_path.write_text(json.dumps({"fail_load_every": 1}))
    injector = FaultInjector(plan_path=plan_path)
    plan_path.write_text("{not json")
    assert failures(injector, ["r"]) == [True]
    plan_path.write_text(json.dumps({"fail_load_evry": 1}))
    os.utime(plan_path, ns=(1, 2 * 10**18))
    assert failures(injector, ["r"]) == [True]
    assert injector.counters.plan_errors == 2


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"fail_every": 2}, "unknown fault plan keys"),
        ({"fail_load_probability": 1.5}, "not in"),
        ({"fail_load_every": "3"}, "must be int"),
        ({"evict_leased": 1}, "must be bool"),
        ({"load_delay_ms": -1}, ">= 0"),
        ({"lease_timeout_ms": -5.0}, "lease_timeout_ms must be >= 0"),
        ({"store_delay_ms": -1.0}, "store_delay_ms must be >= 0"),
        ({"by_rank": {"rank1": {}}}, "maps a world rank"),
        ({"by_rank": {"1": {"fail_evry": 1}}}, "unknown fault plan keys"),
        ({"by_rank": {"1": {"by_rank": {}}}}, "cannot nest"),
    ],
)
def test_bad_plans_are_rejected_with_the_reason(config, message):
    with pytest.raises(ValueError, match=message):
        FaultPlan.from_dict(config)


def test_by_rank_gives_each_worker_its_own_faults():
    plan = FaultPlan.from_dict(
        {
            "store_delay_ms": 5.0,
            "by_rank": {"0": {"load_delay_ms": 300.0}, "1": {"fail_load_every": 1}},
        }
    )
    workers = [FaultInjector(plan) for _ in range(3)]
    for rank, injector in enumerate(workers):
        injector.rank = rank
    assert [w.on_load("r").fail_reason is not None for w in workers] == [False, True, False]
    assert [w.on_load("r").delay_s for w in workers] == [0.3, 0.0, 0.0]
    assert [w.on_store() for w in workers] == [0.005] * 3
    scheduler_side = FaultInjector(plan)  # rank None: the plan's own keys
    assert scheduler_side.on_load("r").fail_reason is None
