"""NIXL's package follows torch's CUDA build, and a missing one names the pip line to run.

Needs torch alone (the GPU machine's image has no NIXL): tests that need an installed NIXL
package skip without it.
"""

import importlib.util

import pytest
import torch

from kvscope.connector.p2p.transport import nixl_agent


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


@pytest.mark.parametrize(
    ("torch_cuda", "package"),
    [(None, "nixl_cu12"), ("12.8", "nixl_cu12"), ("13.0", "nixl_cu13"), ("13", "nixl_cu13")],
)
def test_the_package_matches_torchs_cuda_major(torch_cuda, package):
    assert nixl_agent.nixl_package(torch_cuda) == package


def test_this_torch_loads_its_own_package_or_names_the_pip_line():
    package = nixl_agent.nixl_package(torch.version.cuda)
    if installed(package):
        assert nixl_agent.load_nixl_api().__name__ == f"{package}._api"
    else:
        with pytest.raises(ImportError) as refused:
            nixl_agent.load_nixl_api()
        pip_name = package.replace("_", "-")
        assert f"pip install --no-deps {pip_name}==1.5.1" in str(refused.value)


@pytest.mark.skipif(installed("nixl_cu13"), reason="nixl_cu13 is installed here")
def test_a_cuda_13_torch_without_nixl_cu13_names_the_package_to_install(monkeypatch):
    # What a cu13 torch beside the old set-up (nixl-cu12 only) met.
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(ImportError) as refused:
        nixl_agent.load_nixl_api()
    assert "pip install --no-deps nixl-cu13==1.5.1" in str(refused.value)
    assert "CUDA 13.0" in str(refused.value)


@pytest.mark.skipif(not installed("nixl_cu12"), reason="needs nixl_cu12")
def test_a_cuda_12_torch_loads_nixl_cu12(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.9")
    assert nixl_agent.load_nixl_api().__name__ == "nixl_cu12._api"


@pytest.mark.skipif(
    torch.version.cuda is not None or not installed("nixl_cu12"),
    reason="the CPU torch beside nixl_cu12",
)
def test_the_cpu_torch_runs_a_real_agent_that_registers_memory():
    agent, name = nixl_agent.new_agent("package-test", 0)
    memory = torch.zeros(4096, dtype=torch.uint8)
    registered = agent.register_memory([(memory.data_ptr(), memory.numel(), 0, "")], "DRAM")
    assert nixl_agent.as_str(agent.name) == name
    assert agent.get_agent_metadata()  # what peers load to read this memory
    agent.deregister_memory(registered)


def test_an_unparsable_cuda_version_is_refused_with_what_was_read():
    with pytest.raises(ValueError, match="'cuda-x'"):
        nixl_agent.nixl_package("cuda-x")
