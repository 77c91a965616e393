"""What one running `vllm serve` says about its KV: over its HTTP API and the P2P side channel.

Sources, each optional: /v1/models (model id), /metrics' vllm:cache_config_info (block size,
prefix caching and its hash algorithm, KV cache dtype), /server_info (only with
VLLM_SERVER_DEV_MODE=1: the whole vLLM config, tensor parallel size and kv_transfer_config), and
the P2P connector's side channel (the KV layout its worker serves to peers), found from the
kv_transfer_config or given. A fact no source gives is None, with why in `unknown`.
"""

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import httpx
from prometheus_client.parser import text_string_to_metric_families

HASH_SEED_UNKNOWN = (
    "not exposed: vLLM seeds its block hashes from the server's PYTHONHASHSEED (or a fixed "
    "seed for sha256), which no endpoint shows; start both servers with the same environment"
)

SERVER_INFO_TIMEOUT_S = 60.0
"""The least a probe waits for /server_info: vLLM answers its first call only after collecting
the system's environment (pip, lscpu and more, as subprocesses), seconds on an idle machine and
past 10 s on a busy one; later calls are answered from its cache."""


@dataclass
class ServerFacts:
    """The facts one server exposed (name -> value as text), and why the others are missing."""

    url: str
    facts: dict[str, str | None] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def put(self, name: str, value: Any, source: str) -> None:
        if value is not None and self.facts.get(name) is None:
            self.facts[name] = str(value)
            self.unknown.pop(name, None)
        elif self.facts.get(name) is None:
            self.unknown.setdefault(name, f"{source} does not say")


def probe(url: str, side_channel: str | None = None, timeout_s: float = 10.0) -> ServerFacts:
    """Everything the server at url (and its side channel, 'host:port') says; never raises."""
    found = ServerFacts(url.rstrip("/"))
    with httpx.Client(base_url=found.url, timeout=timeout_s) as client:
        _models(found, client)
        _cache_config(found, client)
        config = _server_info(found, client)
    side_channel = side_channel or _side_channel_of(config, found.url)
    if side_channel:
        _layout(found, side_channel, timeout_s)
    else:
        why = "no side channel: the server runs no kvscope P2P connector (or no /server_info)"
        for name in ("kv_layout", "kv_heads", "head_dim", "kv_dtype"):
            found.unknown.setdefault(name, why)
    found.facts.setdefault("hash_seed", None)
    found.unknown["hash_seed"] = HASH_SEED_UNKNOWN
    return found


def _get(
    found: ServerFacts,
    client: httpx.Client,
    path: str,
    timeout_s: float | None = None,
    **params: str,
) -> httpx.Response:
    try:
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
        response = client.get(path, params=params, timeout=timeout)
    except httpx.HTTPError as exc:
        found.errors.append(f"{path}: {exc.__class__.__name__}: {exc}")
        return httpx.Response(599)
    return response


def _models(found: ServerFacts, client: httpx.Client) -> None:
    response = _get(found, client, "/v1/models")
    data = response.json().get("data", []) if response.status_code == 200 else []
    if response.status_code != 200 or not data:
        found.unknown["model"] = f"/v1/models answered {response.status_code}"
        return
    found.put("model", data[0].get("id"), "/v1/models")
    found.put("max_model_len", data[0].get("max_model_len"), "/v1/models")


def _cache_config(found: ServerFacts, client: httpx.Client) -> None:
    response = _get(found, client, "/metrics")
    labels: dict[str, str] = {}
    source = f"/metrics (answered {response.status_code}) has no vllm:cache_config_info"
    if response.status_code == 200:
        try:
            families = list(text_string_to_metric_families(response.text))
        except ValueError as exc:  # not Prometheus text: a gap like any other, never a crash
            families, source = [], f"/metrics, not Prometheus text ({exc}),"
        for family in families:
            if family.name == "vllm:cache_config_info" and family.samples:
                labels, source = family.samples[0].labels, "/metrics' vllm:cache_config_info"
    found.put("block_size", labels.get("block_size"), source)
    found.put("enable_prefix_caching", labels.get("enable_prefix_caching"), source)
    found.put("prefix_caching_hash_algo", labels.get("prefix_caching_hash_algo"), source)
    found.put("kv_cache_dtype", labels.get("cache_dtype"), source)


def _server_info(found: ServerFacts, client: httpx.Client) -> dict[str, Any]:
    timeout_s = max(client.timeout.read or 0, SERVER_INFO_TIMEOUT_S)
    response = _get(found, client, "/server_info", timeout_s, config_format="json")
    source = "/server_info (needs VLLM_SERVER_DEV_MODE=1)"
    config = response.json().get("vllm_config", {}) if response.status_code == 200 else {}
    config = config if isinstance(config, dict) else {}
    parallel = config.get("parallel_config") or {}
    cache = config.get("cache_config") or {}
    found.put("tensor_parallel_size", parallel.get("tensor_parallel_size"), source)
    found.put("pipeline_parallel_size", parallel.get("pipeline_parallel_size"), source)
    found.put("block_size", cache.get("block_size"), source)
    found.put("prefix_caching_hash_algo", cache.get("prefix_caching_hash_algo"), source)
    found.put("kv_cache_dtype", cache.get("cache_dtype"), source)
    transfer = config.get("kv_transfer_config") or {}
    found.put("kv_connector", transfer.get("kv_connector"), source)
    return config


def _side_channel_of(config: dict[str, Any], url: str) -> str | None:
    """The P2P connector's side channel (rank 0) from the kv_transfer_config, Multi's included."""
    port = _find_key((config.get("kv_transfer_config") or {}), "side_channel_port")
    if not isinstance(port, int):
        return None
    return f"{urlparse(url).hostname or '127.0.0.1'}:{port}"


def _find_key(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        if key in value:
            return value[key]
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            if (hit := _find_key(item, key)) is not None:
                return hit
    return None


def _layout(found: ServerFacts, side_channel: str, timeout_s: float) -> None:
    from kvscope.connector.p2p.transport.side_channel import SideChannelError, fetch_peer_info

    host, _, port = side_channel.rpartition(":")
    source = f"side channel {side_channel}"
    try:
        layout = fetch_peer_info(host or "127.0.0.1", int(port), timeout_s=timeout_s).layout
    except (SideChannelError, ValueError) as exc:
        found.errors.append(f"{source}: {exc}")
        for name in ("kv_layout", "kv_heads", "head_dim", "kv_dtype"):
            found.unknown.setdefault(name, f"{source} did not answer")
        return
    found.put("kv_layout", layout.kv_layout, source)
    found.put("kv_heads", layout.num_kv_heads, source)
    found.put("head_dim", layout.head_dim, source)
    found.put("kv_dtype", layout.dtype, source)
    found.put("block_size", layout.block_size, source)
    found.put("tensor_parallel_size", layout.tp_size, source)
