"""What each CUDA attention backend of vLLM 0.32 and 0.34 declares, as a table that needs no
CUDA import.

FlashInfer, CUTLASS MLA and FlashAttention MLA do not import on the CPU (no `flashinfer`, no
CUDA torch, no FA kernels), so their declarations are copied here from their source;
test_backend_table.py parses each backend's source file in the installed vLLM and fails when
vLLM changes one. The entries are 0.32's; `RELEASE_CHANGES` says what a later release declares
otherwise, and `CUDA_BACKENDS` is the table of the installed release. Where a declaration
depends on the GPU, the entry holds what an H100/H200 (Hopper, SM 9.0) gets.
The entries duck-type the three class methods vLLM's kernel block and layout selection call
(`get_name`, `get_supported_kernel_block_sizes`, `supported_kv_cache_layouts`), so vLLM's own
functions run over them unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from vllm.v1.kv_cache_layout import KVCacheLayout

STANDARD_KINDS: Final = ("full", "sliding_window", "hybrid")
"""Model kinds of the standard (non-MLA) backends: full attention, sliding window, and a hybrid
model with one group of each."""
MLA_KINDS: Final = ("mla",)
"""Model kinds of the MLA backends: DeepSeek-style latent attention (one 'head' per layer)."""


@dataclass(frozen=True)
class Multiple:
    """vLLM's `MultipleOf(base)`: any kernel block size that is a multiple of `base`."""

    base: int

    def __str__(self) -> str:
        return f"multiple of {self.base}"


@dataclass(frozen=True)
class BackendDecl:
    """One backend's declarations, as one vLLM release's source has them on Hopper."""

    name: str  # its AttentionBackendEnum member, which get_name() also returns
    source: str  # its module's file under the vllm package
    class_name: str
    kernel_block_sizes: tuple[int | Multiple, ...]
    kv_cache_dtypes: tuple[str, ...]
    # None: the backend states no layout (vLLM's default preference, LBNHC first, applies).
    kv_cache_layouts: tuple[str, ...] | None
    kinds: tuple[str, ...]
    importable_on_cpu: bool  # whether its module imports here (then the real class is used)

    @property
    def is_mla(self) -> bool:
        return self.kinds == MLA_KINDS

    def get_name(self) -> str:
        return self.name

    def get_supported_kernel_block_sizes(self, kv_cache_spec: Any = None) -> list[Any]:
        from vllm.v1.attention.backend import MultipleOf

        return [
            MultipleOf(size.base) if isinstance(size, Multiple) else size
            for size in self.kernel_block_sizes
        ]

    def supported_kv_cache_layouts(self) -> tuple[KVCacheLayout, ...] | None:
        if self.kv_cache_layouts is None:
            return None
        from vllm.v1.kv_cache_layout import KVCacheLayout

        return tuple(KVCacheLayout[name] for name in self.kv_cache_layouts)

    def vllm_class(self) -> Any:
        """vLLM's own backend class where it imports on this machine, else this entry."""
        if not self.importable_on_cpu:
            return self
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        return AttentionBackendEnum[self.name].get_class()


_FP8: Final = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3")
_ATTN: Final = "v1/attention/backends/"

BACKENDS_032: Final = (
    BackendDecl(
        name="FLASH_ATTN",
        source=_ATTN + "flash_attn.py",
        class_name="FlashAttentionBackend",
        kernel_block_sizes=(Multiple(16),),
        kv_cache_dtypes=_FP8,
        kv_cache_layouts=None,
        kinds=STANDARD_KINDS,
        importable_on_cpu=True,
    ),
    BackendDecl(
        name="FLASHINFER",
        source=_ATTN + "flashinfer.py",
        class_name="FlashInferBackend",
        kernel_block_sizes=(16, 32, 64),
        kv_cache_dtypes=(*_FP8, "fp8_e5m2", "nvfp4", "nvfp4_4over6"),
        kv_cache_layouts=None,
        kinds=STANDARD_KINDS,
        importable_on_cpu=False,
    ),
    BackendDecl(
        name="TRITON_ATTN",
        source=_ATTN + "triton_attn.py",
        class_name="TritonAttentionBackend",
        kernel_block_sizes=(Multiple(16),),
        kv_cache_dtypes=(
            *_FP8,
            "fp8_e5m2",
            "int4_per_token_head",
            "int8_per_token_head",
            "fp8_per_token_head",
        ),
        kv_cache_layouts=None,
        kinds=STANDARD_KINDS,
        importable_on_cpu=True,
    ),
    BackendDecl(
        name="FLEX_ATTENTION",
        source=_ATTN + "flex_attention.py",
        class_name="FlexAttentionBackend",
        kernel_block_sizes=(Multiple(16),),
        kv_cache_dtypes=("auto", "float16", "bfloat16"),
        kv_cache_layouts=("LBNHC",),
        kinds=STANDARD_KINDS,
        importable_on_cpu=True,
    ),
    BackendDecl(
        name="FLASHMLA",
        source=_ATTN + "mla/flashmla.py",
        class_name="FlashMLABackend",
        kernel_block_sizes=(64,),
        kv_cache_dtypes=_FP8,
        kv_cache_layouts=None,
        kinds=MLA_KINDS,
        importable_on_cpu=True,
    ),
    BackendDecl(
        name="FLASHINFER_MLA",
        source=_ATTN + "mla/flashinfer_mla.py",
        class_name="FlashInferMLABackend",
        kernel_block_sizes=(32, 64),
        kv_cache_dtypes=_FP8,
        kv_cache_layouts=None,
        kinds=MLA_KINDS,
        importable_on_cpu=False,
    ),
    BackendDecl(
        name="TRITON_MLA",
        source=_ATTN + "mla/triton_mla.py",
        class_name="TritonMLABackend",
        kernel_block_sizes=(Multiple(16),),
        kv_cache_dtypes=_FP8,
        kv_cache_layouts=None,
        kinds=MLA_KINDS,
        importable_on_cpu=True,
    ),
    BackendDecl(
        name="CUTLASS_MLA",
        source=_ATTN + "mla/cutlass_mla.py",
        class_name="CutlassMLABackend",
        kernel_block_sizes=(128,),
        kv_cache_dtypes=_FP8,
        kv_cache_layouts=None,
        kinds=MLA_KINDS,
        importable_on_cpu=False,
    ),
    BackendDecl(
        name="FLASH_ATTN_MLA",
        source=_ATTN + "mla/flashattn_mla.py",
        class_name="FlashAttnMLABackend",
        kernel_block_sizes=(Multiple(16),),
        kv_cache_dtypes=("auto", "float16", "bfloat16"),
        kv_cache_layouts=None,
        kinds=MLA_KINDS,
        importable_on_cpu=False,
    ),
)
"""vLLM 0.32's CUDA attention backends for decoder models (sparse MLA, which needs DeepSeek
V3.2's indexer, and the fp8-only TokenSpeed MLA are left out)."""

RELEASES: Final = ("0.32", "0.34")
"""The vLLM releases the table holds, oldest first."""
RELEASE_CHANGES: Final[dict[str, dict[str, dict[str, Any]]]] = {
    "0.34": {
        # get_flashinfer_kv_cache_layouts(): vLLM's default preference less LHBNC (FlashInfer
        # names each page NHD or HND; LHBNC puts heads outside blocks). Blackwell: LBHNC, BLHNC.
        "FLASHINFER": {"kv_cache_layouts": ("LBNHC", "LBHNC", "BLNHC", "BLHNC", "BHLNC")},
    },
}
"""What each release after 0.32 declares otherwise: release -> backend -> changed fields."""


def declarations(release: str) -> tuple[BackendDecl, ...]:
    """The table as `release` declares it: 0.32's entries with every later change up to it."""
    if release not in RELEASES:
        raise ValueError(f"no table of vLLM {release}: one of {RELEASES}")
    table = {decl.name: decl for decl in BACKENDS_032}
    for later in RELEASES[1 : RELEASES.index(release) + 1]:
        for name, fields in RELEASE_CHANGES.get(later, {}).items():
            table[name] = replace(table[name], **fields)
    return tuple(table.values())


def installed_release() -> str:
    """The release whose table the installed vLLM is held to: the newest not after it (the
    newest without vLLM); test_backend_table.py says whether its source agrees."""
    try:
        from vllm import __version__
    except ImportError:
        return RELEASES[-1]
    installed = _minor(__version__)
    return max(
        (release for release in RELEASES if _minor(release) <= installed),
        key=_minor,
        default=RELEASES[0],
    )


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


CUDA_BACKENDS: Final = declarations(installed_release())
"""The CUDA backends as the installed vLLM release declares them."""


def backend(name: str) -> BackendDecl:
    """The table entry of one backend, by its AttentionBackendEnum name."""
    for decl in CUDA_BACKENDS:
        if decl.name == name:
            return decl
    raise KeyError(f"no CUDA backend {name!r}: one of {[d.name for d in CUDA_BACKENDS]}")
