"""The dashboard's one way to the backend: reads of its HTTP API, cached per data version.

Every live part first asks for the data version (the backend's count of stored spans, one
cheap call); the other reads are cached under that version, so an unchanged backend costs
one request per refresh however many viewers and charts there are, and a new span makes the
next refresh read fresh data. The TTL bounds how stale time-dependent figures can get.
"""

import json

import httpx
import streamlit as st

from kvscope.dashboard.settings import get_settings

CACHE_TTL_S = 10.0
MAX_BLOCKS = 20_000
PAGE = 1000


class BackendUnreachable(Exception):
    """The backend did not answer (not running, wrong URL, or failing)."""


class BackendRefused(Exception):
    """The backend answered 401/403: the token is missing or wrong."""


@st.cache_resource
def _http() -> httpx.Client:
    settings = get_settings()
    token = settings.backend_token
    return httpx.Client(
        base_url=settings.backend_url.rstrip("/"),
        timeout=settings.timeout_s,
        headers={"Authorization": f"Bearer {token}"} if token else {},
    )


def get(path: str, **params):
    """GET path and decode its JSON; None-valued parameters are left out."""
    query = {name: value for name, value in params.items() if value is not None}
    try:
        response = _http().get(path, params=query)
    except httpx.HTTPError as error:
        raise BackendUnreachable(f"{type(error).__name__}: {error}") from None
    if response.status_code in (401, 403):
        raise BackendRefused(response.json().get("detail", response.text))
    if response.status_code >= 500:
        raise BackendUnreachable(f"HTTP {response.status_code}: {response.text[:200]}")
    response.raise_for_status()
    return response.json()


def data_version() -> int:
    """Changes whenever the backend stores spans; raises BackendUnreachable when it is down."""
    health = get("/health")
    if health.get("status") != "ok":
        raise BackendUnreachable(f"backend unhealthy: {health.get('database')}")
    return int(health.get("spans_stored_since_start", 0))


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def summary(version: int, window_s: float) -> dict:
    return get("/api/v1/stats/summary", window_s=window_s)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def hit_rates(version: int, window_s: float) -> list[dict]:
    return get("/api/v1/stats/hits", window_s=window_s)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def streams(version: int) -> list[dict]:
    return get("/api/v1/streams")


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def failures(version: int, since_ns: int | None = None, limit: int = 500, **filters) -> dict:
    return get("/api/v1/failures", since_ns=since_ns, limit=limit, **filters)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def requests(version: int, limit: int = 200, **filters) -> dict:
    return get("/api/v1/requests", limit=limit, **filters)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=256)
def timeline(version: int, request_key: int) -> dict:
    return get(f"/api/v1/requests/{request_key}/timeline")


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=256)
def spans(version: int, request_key: int) -> list[dict]:
    return get(f"/api/v1/requests/{request_key}/spans")


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def leases(version: int, active: bool | None = None, limit: int = 500) -> dict:
    return get("/api/v1/leases", active=active, limit=limit)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=16)
def blocks(version: int, engine_id: str | None = None) -> dict:
    """Every block slot (up to MAX_BLOCKS), paged through; certainty from the first page."""
    first = get("/api/v1/blocks", engine_id=engine_id, limit=PAGE)
    items = list(first["items"])
    while len(items) < min(first["total"], MAX_BLOCKS):
        more = get("/api/v1/blocks", engine_id=engine_id, offset=len(items), limit=PAGE)
        if not more["items"]:
            break
        items.extend(more["items"])
    return {**first, "items": items}


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def block_history(version: int, engine_id: str, tier: str, block_id: int) -> dict:
    """What the API knows of one block slot: leases that pinned it (host pool ids) and
    load failures that named it (engine block ids)."""
    if tier == "host":
        found = get("/api/v1/leases", engine_id=engine_id, limit=PAGE)["items"]
        return {"leases": [x for x in found if block_id in _ids(x.get("host_block_ids"))]}
    found = get("/api/v1/failures", engine_id=engine_id, limit=PAGE)["items"]
    return {"failures": [x for x in found if block_id in _ids(x.get("block_ids"))]}


def _ids(text: str | None) -> list[int]:
    return json.loads(text) if text else []


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def series(version: int, window_s: float) -> dict:
    """Hit rate, bytes/s per path, leases held, failures per cause and TTFT over the window."""
    return get("/api/v1/stats/series", window_s=window_s)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=16)
def engines(version: int) -> list[dict]:
    """Engines with their service name, role and whether they stopped reporting."""
    return get("/api/v1/stats/engines")


def engine_labels(version: int) -> dict[str, str]:
    """engine id (and process id) -> 'vllm-prefill (kv_producer)', for every table."""
    found = engines(version)
    names = [engine["label"] for engine in found]
    labels: dict[str, str] = {}
    for engine in found:
        label = engine["label"]
        if names.count(label) > 1:  # two engines of one service: their ids tell them apart
            label = f"{label} · {engine['engine_id'][:8]}"
        label += " · gone" if engine["gone"] else ""
        for key in [engine["engine_id"], *engine["instance_ids"]]:
            labels[key] = label
    return labels


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def incidents(version: int, since_ns: int | None = None, limit: int = 500, **filters) -> dict:
    """Failure incidents, newest first: one per fault, its reports folded in."""
    return get("/api/v1/failures/incidents", since_ns=since_ns, limit=limit, **filters)


def _or_none_if_missing(path: str, **params):
    """An older backend without the route answers 404: the panel then shows nothing."""
    try:
        return get(path, **params)
    except httpx.HTTPStatusError as error:
        if error.response.status_code == 404:
            return None
        raise


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=16)
def tiers(version: int) -> list[dict]:
    """Each engine's KV tiers (offload pool, P2P peers) in their latest health state."""
    return _or_none_if_missing("/api/v1/tiers") or []


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=16)
def clocks(version: int) -> dict | None:
    """Each process's clock offset estimate against the backend's, and whether they mix."""
    return _or_none_if_missing("/api/v1/clocks")


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def recomputes(version: int, window_s: float) -> dict | None:
    """Requests answered normally although a KV load failed and was recomputed, per engine and
    cause (None from a backend without the route)."""
    return _or_none_if_missing("/api/v1/stats/recomputes", window_s=window_s)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def accounting(version: int, window_s: float) -> dict | None:
    """Token accounting per engine and the requests whose tokens do not add up (None from a
    backend without the route)."""
    return _or_none_if_missing("/api/v1/stats/accounting", window_s=window_s)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def misses(version: int, window_s: float) -> dict | None:
    """Why prompt tokens missed the tiers, per engine (None from a backend without the route)."""
    return _or_none_if_missing("/api/v1/stats/misses", window_s=window_s)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def tier_alarms(version: int, window_s: float) -> dict | None:
    """The host tiers' alarms and reuse figures (None from a backend without the route)."""
    return _or_none_if_missing("/api/v1/stats/tier-alarms", window_s=window_s)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=256)
def request_misses(version: int, request_key: int) -> dict | None:
    """One request's missed tokens by reason (None: not accounted yet, or still running)."""
    try:
        return _or_none_if_missing(f"/api/v1/requests/{request_key}/misses")
    except httpx.HTTPStatusError as error:
        if error.response.status_code == 409:
            return None
        raise
