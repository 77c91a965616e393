"""Kernel-block views regrouped as vLLM's own offloader regroups them, with torch alone."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvscope.connector.cpu_offload.kernel_blocks import group_kernel_blocks, group_layers

ROOT = Path(__file__).resolve().parents[2]
SPLIT_CASES = [("FLASHINFER", "full", 128, "auto"), ("CUTLASS_MLA", "mla", 256, "fp8")]


def handoff(tiny_model, case):
    pytest.importorskip("vllm")
    from tests.gpu_handoff.builder import build_worker_kv_caches

    return build_worker_kv_caches(*case, num_blocks=8, model=tiny_model)


@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: "-".join(map(str, c)))
def test_regrouped_views_are_the_ones_vllm_regroups(tiny_model, case):
    from vllm.v1.kv_cache_interface import group_kernel_blocks as vllm_group_kernel_blocks

    split = handoff(tiny_model, case)
    assert split.blocks_per_kv_block == 2
    for view in split.kv_caches.values():
        ours, theirs = group_kernel_blocks(view, 8), vllm_group_kernel_blocks(view, 8)
        assert (ours.shape, ours.stride(), ours.data_ptr()) == (
            theirs.shape,
            theirs.stride(),
            theirs.data_ptr(),
        )
        assert ours.shape[:2] == (8, 2)


def test_whole_blocks_are_left_as_they_are(tiny_model):
    whole = handoff(tiny_model, ("FLASH_ATTN", "full", 16, "auto"))
    layers = list(whole.kv_caches.values())
    assert group_layers(layers, 8) is None
    assert group_kernel_blocks(layers[0], 8) is layers[0]


def test_rows_that_do_not_split_into_the_blocks_are_refused_saying_what_to_pass():
    with pytest.raises(ValueError, match="register the views vLLM allocated"):
        group_kernel_blocks(torch.zeros(12, 2, 16, 8), 8)


def test_it_imports_with_torch_alone():
    """The GPU machine has torch but no vLLM, NIXL or OpenTelemetry."""
    blocked = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('vllm', 'nixl', 'opentelemetry'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import kvscope.connector.cpu_offload.kernel_blocks\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", blocked], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
