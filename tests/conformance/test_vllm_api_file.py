"""kvscope's wrappers against each vLLM release's connector API read from its source (checked-in
files made by scripts/connector_api.py): what a user upgrading to vLLM 0.33 or 0.34 on CUDA
would find unforwarded fails here, on this machine's vLLM 0.32, before any engine starts."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import vllm

from kvscope.connector.multi.connector import KvscopeMultiConnector
from kvscope.connector.multi.core import MultiCore
from kvscope.connector.traced import TracedBase, TracedConnector
from kvscope.traces.forwarding import (
    ANSWERED_BY_WRAPPER,
    API_CLASSES,
    member_of,
    parameter_names,
    vllm_connector_api,
)
from scripts.connector_api import connector_api

RELEASES = ("0.33.0", "0.34.0")
"""The releases whose API files are checked in beside this module."""

ADDED = {
    "0.33.0": {"supports_sleep_mode", "unregister_kv_caches", "restore_kv_caches"},
    "0.34.0": {"kv_cache_access", "supports_lookahead_block_hashes", "may_load_async"},
}
"""What each release adds to the one before (0.32 before 0.33): the vLLM versions page's table."""

MULTI_OWN = ANSWERED_BY_WRAPPER | {"role"}
"""What the Multi answers from its own state: its role is the one its children are built with."""


def api_file(release: str) -> Path:
    return Path(__file__).with_name(f"vllm_{release}_connector_api.json")


def api_of(release: str) -> dict[str, dict]:
    classes = json.loads(api_file(release).read_text())["classes"]
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


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("wrapper", [TracedConnector, KvscopeMultiConnector])
def test_the_wrappers_forward_every_member_of_each_release(wrapper, release):
    assert unforwarded(wrapper, api_of(release), ANSWERED_BY_WRAPPER) == []


@pytest.mark.parametrize("release", RELEASES)
def test_the_multi_core_combines_every_member_of_each_release(release):
    assert unforwarded(MultiCore, api_of(release), MULTI_OWN) == []


def test_each_release_adds_the_members_the_version_table_names():
    """0.32's members from the installed vLLM when it is 0.32, else from what 0.33 added."""
    before = set(api_of("0.33.0")) - ADDED["0.33.0"]
    if vllm.__version__.startswith("0.32."):
        assert before == {name for members in vllm_connector_api().values() for name in members}
    for release in RELEASES:
        api = set(api_of(release))
        assert api - before == ADDED[release], release
        before = api


@pytest.mark.parametrize("release", RELEASES)
def test_the_file_of_the_installed_release_is_what_it_declares(release):
    """On the 0.34 lane (or any release with a file here) the file is the live API."""
    if not vllm.__version__.startswith(release):
        pytest.skip(f"vLLM {vllm.__version__} is installed, not {release}")
    live = {name: {"kind": m.kind, "params": list(m.params)} for name, m in _live().items()}
    assert live == api_of(release)


def _live():
    return {
        name: member
        for members in vllm_connector_api().values()
        for name, member in members.items()
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

    problems = unforwarded(Bare, api_of("0.34.0"), frozenset())
    assert "get_finished: not forwarded" in problems
    assert "unregister_kv_caches: not forwarded" in problems
    assert "may_load_async: not forwarded" in problems


def test_a_changed_kind_is_reported():
    api = {"supports_sleep_mode": {"kind": "method", "params": ["kv_transfer_config"]}}
    assert unforwarded(TracedConnector, api, frozenset()) == [
        "supports_sleep_mode: classmethod here, method in vLLM"
    ]


@pytest.mark.parametrize("release", RELEASES)
def test_the_file_says_which_release_it_is(release):
    data = json.loads(api_file(release).read_text())
    assert data["vllm_version"] == release
    assert asdict(member_of(TracedBase.__dict__["build_kv_connector_stats"])) == {
        "kind": "classmethod",
        "params": ("data",),
    }
