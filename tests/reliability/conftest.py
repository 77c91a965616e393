"""Fixtures of the fault matrix: the backend, spans exported to it, the oracle, prefill peers."""

import pytest

from kvscope.bench.pd.pd_pair import p2p_transfer_config
from kvscope.harness.backend_process import BackendProcess
from kvscope.harness.engine import engine_env, free_port
from tests.oracle_cache import prompt_set
from tests.reliability.cases import CASES
from tests.reliability.prefill_peer import PrefillPeer
from tests.reliability.record import EXPORT_TIMEOUT_S, PEER_LEASE_S, Recorder

EXPORT_QUEUE = 16384
"""This process's export queue to the backend: no cell fills it (queue_full cells shrink it)."""


BASELINES = {case.id: prompt_set(case.prompts(), case.max_tokens) for case in CASES}
"""One prompt set a cell: the oracle generates a cell's prompts together, as the cell's engine
does. vLLM's CPU kernels are not batch-invariant: on a Xeon with AMX, greedy tokens of the same
prompts in a batch of 4 and of 20 differed from token 30 on (README.md here)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Remember whether P2P cells will run: then the prefill peers start with the session."""
    config.stash[_WANTS_PEERS] = any(
        "/reliability/" in item.nodeid and ("p2p" in item.nodeid or "multi" in item.nodeid)
        for item in items
    )


_WANTS_PEERS = pytest.StashKey[bool]()


@pytest.fixture(scope="session")
def matrix_dir(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("reliability")


@pytest.fixture(scope="session")
def backend(matrix_dir):
    process = BackendProcess(matrix_dir).start()
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.fixture(scope="session")
def recorder(span_exporter, backend) -> Recorder:
    """This process's spans go to the backend too, through a bounded queue that counts drops."""
    from kvscope.traces.sdk import configure
    from kvscope.traces.sdk.exporters import OtlpJsonHttpExporter
    from kvscope.traces.sdk.settings import TracingSettings

    settings = TracingSettings(
        max_queue_size=EXPORT_QUEUE, max_batch_size=512, schedule_delay_s=0.05
    )
    exporter = OtlpJsonHttpExporter(backend.traces_url, timeout_s=EXPORT_TIMEOUT_S)
    assert configure.add_exporter(exporter, settings)
    (processor,) = [p for p in configure._processors if p.exporter is exporter]
    return Recorder(backend, configure._sequence._origin, processor)


@pytest.fixture(scope="session")
def expected(oracle) -> dict[str, list[int]]:
    """The oracle: greedy tokens of every cell's prompts from an engine without a connector."""
    tokens: dict[str, list[int]] = {}
    for case in CASES:
        ids = [f"{case.id}-{i}" for i in range(case.num_prompts)]
        tokens |= dict(zip(ids, oracle.tokens(BASELINES[case.id]), strict=True))
    return tokens


def _start_peer(tiny_model, matrix_dir, backend: BackendProcess, name: str) -> PrefillPeer:
    config = p2p_transfer_config(free_port(), lease_timeout_s=PEER_LEASE_S)
    env = engine_env(
        KVSCOPE_OTLP_ENDPOINTS=f"http+json://127.0.0.1:{backend.port}/v1/traces",
        OTEL_SERVICE_NAME=f"reliability-{name}",
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    return PrefillPeer(tiny_model, config, env, matrix_dir / f"{name}.log")


@pytest.fixture(scope="session")
def peers(request, tiny_model, matrix_dir, backend):
    """(prefill, victim): two prefill engines in subprocesses; peer_killed cells kill the
    victim. Started with the session when P2P cells are selected, so they boot meanwhile."""
    started = [_start_peer(tiny_model, matrix_dir, backend, name) for name in ("prefill", "victim")]
    try:
        yield started
    finally:
        for peer in started:
            peer.stop()


@pytest.fixture(scope="session", autouse=True)
def _early_peers(request):
    if request.config.stash.get(_WANTS_PEERS, False):
        request.getfixturevalue("peers")


@pytest.fixture(scope="session")
def prefill(peers) -> PrefillPeer:
    return peers[0].wait_ready()


@pytest.fixture(scope="session")
def victim(peers) -> PrefillPeer:
    return peers[1]
