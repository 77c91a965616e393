"""The CUDA notes page's attention backend table, rendered from the hand-off harness's table.

`python -m tests.gpu_handoff.readme_table` prints it; test_readme_backends.py checks that the
page holds exactly this between its markers.
"""

from collections.abc import Callable
from typing import Final

from tests.gpu_handoff.backends import RELEASES, BackendDecl, declarations
from tests.gpu_handoff.builder import BLOCK_SIZES, KV_DTYPES, handoff_cases

START: Final = "<!-- cuda-backends:start (python -m tests.gpu_handoff.readme_table) -->"
"""The line before the generated table in docs/connectors/cuda.md."""
END: Final = "<!-- cuda-backends:end -->"
"""The line after it."""
KIND_NAMES: Final = {
    "full": "full",
    "sliding_window": "sliding window",
    "hybrid": "hybrid (full + sliding window)",
    "mla": "MLA",
}
"""How the table names the builder's model kinds."""


def render() -> str:
    """The table, one row per backend, between START and END: the newest release's declarations,
    and a field a release declares otherwise written per release."""
    from vllm.v1.worker.utils import select_common_block_size

    by_release = {release: declarations(release) for release in RELEASES}
    backends = by_release[RELEASES[-1]]
    cases = handoff_cases(BLOCK_SIZES, backends=backends)
    rows = [
        START,
        "| Backend | Model kinds | Kernel blocks (Hopper) | KV blocks tested | KV dtypes"
        " (tested) | Layouts |",
        "|---|---|---|---|---|---|",
    ]
    for decl in backends:
        sizes = sorted({case[2] for case in cases if case[0] == decl.name})
        tested = ", ".join(
            _block(size, select_common_block_size(size, [decl], [None])) for size in sizes
        )
        rows.append(
            f"| {decl.name} | {', '.join(KIND_NAMES[k] for k in decl.kinds)} |"
            f" {', '.join(str(s) for s in decl.kernel_block_sizes)} | {tested} |"
            f" {_dtypes(decl)} | {_per_release(decl.name, by_release, _layouts)} |"
        )
    return "\n".join([*rows, END])


def _block(size: int, kernel: int) -> str:
    return str(size) if kernel == size else f"{size} (as {size // kernel}x{kernel})"


def _dtypes(decl: BackendDecl) -> str:
    return ", ".join(f"**{d}**" if d in KV_DTYPES else d for d in decl.kv_cache_dtypes)


def _per_release(
    name: str,
    by_release: dict[str, tuple[BackendDecl, ...]],
    show: Callable[[BackendDecl], str],
) -> str:
    """`show` of the backend once where every release agrees, else per release ("0.32: ...")."""
    shown = {
        release: show(next(d for d in decls if d.name == name))
        for release, decls in by_release.items()
    }
    if len(set(shown.values())) == 1:
        return next(iter(shown.values()))
    return "; ".join(f"{release}: {text}" for release, text in shown.items())


def _layouts(decl: BackendDecl) -> str:
    return (
        "none declared (LBNHC first)"
        if decl.kv_cache_layouts is None
        else ", ".join(decl.kv_cache_layouts)
    )


if __name__ == "__main__":
    print(render())
