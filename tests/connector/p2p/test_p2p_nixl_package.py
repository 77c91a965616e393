"""NIXL's package follows torch's CUDA build, and a missing one names the pip line to run."""

import os

import pytest
import torch

os.environ.setdefault("UCX_NET_DEVICES", "lo")

from kvscope.connector.p2p import nixl_agent  # noqa: E402


@pytest.mark.parametrize(
    ("torch_cuda", "package"),
    [(None, "nixl_cu12"), ("12.8", "nixl_cu12"), ("13.0", "nixl_cu13"), ("13", "nixl_cu13")],
)
def test_the_package_matches_torchs_cuda_major(torch_cuda, package):
    assert nixl_agent.nixl_package(torch_cuda) == package


def test_a_cuda_13_torch_without_nixl_cu13_names_the_package_to_install(monkeypatch):
    # This machine has only nixl_cu12: what a cu13 torch beside the old setup would meet.
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(ImportError) as refused:
        nixl_agent.load_nixl_api()
    assert "pip install --no-deps nixl-cu13==1.5.1" in str(refused.value)
    assert "CUDA 13.0" in str(refused.value)


def test_a_cuda_12_torch_loads_nixl_cu12(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.9")
    assert nixl_agent.load_nixl_api().__name__ == "nixl_cu12._api"


def test_the_cpu_torch_runs_a_real_agent_that_registers_memory():
    assert torch.version.cuda is None  # the CPU build this suite runs on
    agent, name = nixl_agent.new_agent("package-test", 0)
    memory = torch.zeros(4096, dtype=torch.uint8)
    registered = agent.register_memory([(memory.data_ptr(), memory.numel(), 0, "")], "DRAM")
    assert nixl_agent.as_str(agent.name) == name
    assert agent.get_agent_metadata()  # what peers load to read this memory
    agent.deregister_memory(registered)


def test_an_unparsable_cuda_version_is_refused_with_what_was_read():
    with pytest.raises(ValueError, match="'cuda-x'"):
        nixl_agent.nixl_package("cuda-x")
