"""The CUDA backend table still says what each backend's source in the installed vLLM declares.

Each entry of the installed release's table is checked against its backend's module, parsed
(ast), so the backends that need CUDA, flashinfer or FA kernels to import are checked too; those
that import here are also checked against their live class. Every member of vLLM's
AttentionBackendEnum is either in the table or left out for a stated reason: a backend a new
vLLM adds fails by name.
"""

import ast
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")

from tests.gpu_handoff.backends import (  # noqa: E402
    CUDA_BACKENDS,
    RELEASES,
    BackendDecl,
    Multiple,
    installed_release,
)

VLLM_ROOT = Path(vllm.__file__).parent
LEFT_OUT = {
    "FLASH_ATTN_DIFFKV": "different K and V head sizes: no standard model kind",
    "TRITON_ATTN_DIFFKV": "different K and V head sizes: no standard model kind",
    "TRITON_FLASH_ATTN": "ROCm's Triton flash attention",
    "ROCM_ATTN": "ROCm",
    "ROCM_SEGMENTED_ATTN": "ROCm",
    "ROCM_AITER_MLA": "ROCm",
    "ROCM_AITER_TRITON_MLA": "ROCm",
    "ROCM_AITER_FA": "ROCm",
    "ROCM_AITER_MLA_SPARSE": "ROCm",
    "ROCM_AITER_UNIFIED_ATTN": "ROCm",
    "ROCM_FLASHMLA_SPARSE_DSV4": "ROCm",
    "XPU_MLA_SPARSE": "Intel XPU",
    "TORCH_SDPA": "vision encoders only, no KV cache",
    "TRITON_FLASHINFER": "a Triton fallback of FlashInfer's API, not selected on Hopper",
    "TOKENSPEED_MLA": "fp8 KV only, Blackwell",
    "FLASHINFER_MLA_SPARSE": "sparse MLA (DeepSeek V3.2's indexer cache beside the latent)",
    "FLASHINFER_MLA_SPARSE_SM120": "sparse MLA",
    "FLASHINFER_MLA_SPARSE_SM90": "sparse MLA",
    "FLASHMLA_SPARSE": "sparse MLA",
    "FLASHMLA_SPARSE_DSV4": "DeepSeek V4's packed sparse MLA",
    "FLASHINFER_MLA_SPARSE_DSV4": "DeepSeek V4's packed sparse MLA",
    "FLASHMLA_SPARSE_DSV41": "DeepSeek V4.1's packed sparse MLA",
    "FLASHINFER_MLA_SPARSE_DSV41": "DeepSeek V4.1's packed sparse MLA",
    "FLASHMLA_MEGA_ATTN_DSV41": "DeepSeek V4.1's packed sparse MLA",
    "FLASH_ATTN_MLA_SPARSE": "sparse MLA",
    "MINIMAX_M3_SPARSE": "MiniMax M3's sparse attention",
    "CUTLASS_MSA": "MiniMax M3's sparse attention",
    "TRITON_MSA": "MiniMax M3's sparse attention",
    "B12X": "Blackwell-only paged attention",
    "NO_ATTENTION": "attention-free models: no KV cache",
    "HPC_ATTN": "not a CUDA GPU backend",
    "CPU_ATTN": "the CPU platform",
    "CPU_MLA": "the CPU platform",
    "AMX_MLA": "the CPU platform",
    "TURBOQUANT": "quantized KV layouts of its own",
    "ULTRAQUANT": "quantized KV layouts of its own",
    "CUSTOM": "a placeholder for out-of-tree backends",
}
"""AttentionBackendEnum members of vLLM 0.32 the table leaves out, and why."""
LEFT_OUT_SINCE = {
    "0.34": {
        "FLASHINFER_TS": "FlashInfer's task-scheduled decode for drafters, Blackwell only",
        "KIMI_K3_KV_BALANCED_MLA": "fp8 KV only, Blackwell, never selected automatically",
        "FLASH_ATTN_MLA_SPARSE_FA4": "sparse MLA",
        "STEP5_DSA": "Step5's sparse attention",
        "ROCM_FLASHMLA_SPARSE_DSV41": "ROCm",
        "ROCM_OCTAVE": "ROCm",
    },
}
"""Members a later release added that the table leaves out, and why, by release."""


def left_out(release: str) -> dict[str, str]:
    """What the table leaves out of `release`'s AttentionBackendEnum."""
    reasons = dict(LEFT_OUT)
    for later in RELEASES[1 : RELEASES.index(release) + 1]:
        reasons.update(LEFT_OUT_SINCE.get(later, {}))
    return reasons


def backend_class(decl: BackendDecl) -> ast.ClassDef:
    tree = ast.parse((VLLM_ROOT / decl.source).read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == decl.class_name:
            return node
    raise AssertionError(f"{decl.source} has no class {decl.class_name}")


def member(cls: ast.ClassDef, name: str) -> ast.AST | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        if isinstance(node, ast.Assign | ast.AnnAssign) and any(
            isinstance(t, ast.Name) and t.id == name for t in targets
        ):
            return node.value
    return None


def returned(function: ast.AST) -> list[ast.AST | None]:
    return [n.value for n in ast.walk(function) if isinstance(n, ast.Return)]


def block_sizes(node: ast.AST) -> tuple[int | Multiple, ...] | None:
    """A literal list of kernel block sizes: ints and MultipleOf(n)."""
    if not isinstance(node, ast.List):
        return None
    sizes: list[int | Multiple] = []
    for element in node.elts:
        if isinstance(element, ast.Constant) and isinstance(element.value, int):
            sizes.append(element.value)
        elif isinstance(element, ast.Call) and getattr(element.func, "id", "") == "MultipleOf":
            sizes.append(Multiple(element.args[0].value))
        else:
            return None
    return tuple(sizes)


def layouts(node: ast.AST | None) -> tuple[str, ...] | None:
    """A literal tuple of KVCacheLayout members, or a call of one of vLLM's layout helpers in
    `vllm.v1.attention.backends.utils` (0.34's FlashInfer), called here."""
    if isinstance(node, ast.Tuple):
        return tuple(element.attr for element in node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args:
        from vllm.v1.attention.backends import utils

        helper = getattr(utils, node.func.id, None)
        if helper is not None:
            return tuple(layout.name for layout in helper())
    return None


def inherits_layouts(node: ast.AST | None) -> bool:
    """`return super().supported_kv_cache_layouts()`, or None."""
    if node is None or isinstance(node, ast.Constant) and node.value is None:
        return True
    return isinstance(node, ast.Call) and "super" in ast.dump(node)


@pytest.mark.parametrize("decl", CUDA_BACKENDS, ids=lambda d: d.name)
def test_the_table_matches_the_backends_source(decl):
    cls = backend_class(decl)
    dtypes = member(cls, "supported_kv_cache_dtypes")
    assert dtypes is not None, f"{decl.class_name} no longer declares its KV cache dtypes"
    assert tuple(ast.literal_eval(dtypes)) == decl.kv_cache_dtypes
    name = member(cls, "get_name")
    assert [ast.literal_eval(value) for value in returned(name)] == [decl.name]
    sizes = [
        block_sizes(value) for value in returned(member(cls, "get_supported_kernel_block_sizes"))
    ]
    assert decl.kernel_block_sizes in sizes, f"{decl.name} now returns {sizes}"
    declared = member(cls, "supported_kv_cache_layouts")
    options = returned(declared) if declared is not None else [None]
    if decl.kv_cache_layouts is None:
        assert any(inherits_layouts(value) for value in options)
    else:
        assert decl.kv_cache_layouts in [layouts(value) for value in options]


@pytest.mark.parametrize(
    "decl", [d for d in CUDA_BACKENDS if d.importable_on_cpu], ids=lambda d: d.name
)
def test_the_backends_that_import_here_answer_as_the_table_says(decl):
    live = decl.vllm_class()
    assert live is not decl and live.get_name() == decl.name
    assert tuple(live.supported_kv_cache_dtypes) == decl.kv_cache_dtypes
    assert live.get_supported_kernel_block_sizes() == decl.get_supported_kernel_block_sizes()
    assert live.supported_kv_cache_layouts() == decl.supported_kv_cache_layouts()
    assert live.is_mla() == decl.is_mla


def test_every_backend_vllm_registers_is_in_the_table_or_left_out_for_a_reason():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    tabled = {decl.name for decl in CUDA_BACKENDS}
    registered = {backend.name for backend in AttentionBackendEnum}
    reasons = left_out(installed_release())
    assert registered - tabled - set(reasons) == set(), "new backends: table or leave out"
    assert tabled & set(reasons) == set()
    assert set(reasons) - registered == set(), "vLLM dropped these: remove them here"
