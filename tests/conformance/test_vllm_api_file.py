"""kvscope's wrappers against a vLLM release's connector API read from its source (a checked-in
file made by scripts/connector_api.py): what a user upgrading to vLLM 0.33 on CUDA would find
unforwarded fails here, on this machine's vLLM 0.32, before any engine starts."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import vllm

from kvscope.connector.multi.connector import KvscopeMultiConnector
from kvscope.connector.multi.core import MultiCore
from kvscope.connector.traced import TracedConnector
from kvscope.traces.forwarding import (
    ANSWERED_BY_WRAPPER,
    API_CLASSES,
    member_of,
    parameter_names,
    vllm_connector_api,
)
from scripts.connector_api import connector_api

API_033 = Path(__file__).with_name("vllm_0.33.0_connector_api.json")

MULTI_OWN = ANSWERED_BY_WRAPPER | {"role"}
"""What the Multi answers from its own state: its role is the one its children are built with."""


def api_033() -> dict[str, dict]:
    classes = json.loads(API_033.read_text())["classes"]
    return {name: kind for members in classes.values() for name, kind in members.items()}


def owner(cls: type, name: str) -> type | None:
    return next((klass for klass in cls.__mro__ if name in vars(klass)), None)


def unforwarded(cls: type, api: dict[str, dict], own: frozenset[str]) -> list[str]:
    """Members of api that cls leaves to vLLM's base class or lacks, or whose kind or
    parameters differ from the release's (a forwarding method takes whatever it gets)."""
    problems = []
    for name, declared in sorted(api.items()):
        klass = owner(cls, name)
        if klass is None or klass in API_CLASSES:
            if name not in own:
                problems.append(f"{name}: not forwarded")
            continue
        value = vars(klass)[name]
        mine = member_of(value)
        if mine.kind != declared["kind"]:
            problems.append(f"{name}: {mine.kind} here, {declared['kind']} in vLLM")
        elif mine.kind != "property" and not _accepts(value, declared["params"]):
            problems.append(f"{name}: parameters {list(mine.params)}, vLLM's {declared['params']}")
    return problems


def _accepts(value, params: list[str]) -> bool:
    function = value.__func__ if isinstance(value, classmethod | staticmethod) else value
    if "__signature__" in vars(function):  # a generated forwarder: takes *args, **kwargs
        return True
    mine = parameter_names(function, bound=not isinstance(value, staticmethod))
    return list(mine) == params or any(p.startswith("*") for p in mine)


@pytest.mark.parametrize("wrapper", [TracedConnector, KvscopeMultiConnector])
def test_the_wrappers_forward_every_member_of_vllm_033(wrapper):
    assert unforwarded(wrapper, api_033(), ANSWERED_BY_WRAPPER) == []


def test_the_multi_core_combines_every_member_of_vllm_033():
    assert unforwarded(MultiCore, api_033(), MULTI_OWN) == []


def test_vllm_033_adds_the_sleep_mode_members_to_032():
    """The three members the README's version policy names."""
    installed = {name for members in vllm_connector_api().values() for name in members}
    assert set(api_033()) - installed == {
        "supports_sleep_mode",
        "unregister_kv_caches",
        "restore_kv_caches",
    }


def test_the_extractor_reads_the_installed_vllm_as_importing_it_does():
    from_source = connector_api(Path(vllm.__file__).parent)
    live = {
        cls: {name: {"kind": m.kind, "params": list(m.params)} for name, m in members.items()}
        for cls, members in vllm_connector_api().items()
    }
    assert from_source == live


def test_a_member_left_to_vllms_base_is_reported_by_name():
    """The check can fail: a class that forwards nothing reports every instance member."""

    class Bare(*API_CLASSES):
        pass

    problems = unforwarded(Bare, api_033(), frozenset())
    assert "get_finished: not forwarded" in problems
    assert "unregister_kv_caches: not forwarded" in problems


def test_a_changed_kind_is_reported():
    api = {"supports_sleep_mode": {"kind": "method", "params": ["kv_transfer_config"]}}
    assert unforwarded(TracedConnector, api, frozenset()) == [
        "supports_sleep_mode: classmethod here, method in vLLM"
    ]


def test_the_file_says_which_release_it_is():
    data = json.loads(API_033.read_text())
    assert data["vllm_version"] == "0.33.0"
    assert asdict(member_of(TracedConnector.__dict__["build_kv_connector_stats"])) == {
        "kind": "classmethod",
        "params": ("data",),
    }
