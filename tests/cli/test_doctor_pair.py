"""`kvscope doctor --pair` against real servers: the demo's kind of P/D pair agrees, a server with
another block size is named as a mismatch, and a dead URL fails rather than passing."""

import subprocess
import sys

import pytest

from kvscope.bench.pd.pd_pair import PDPair
from kvscope.cli.doctor_pair import check_pair
from kvscope.harness.engine import ServerProcess, engine_env, free_port, serve_command

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(600)]
DEV = {"VLLM_SERVER_DEV_MODE": "1"}  # /server_info: tensor parallel size, the connector config


@pytest.fixture(scope="module")
def servers(tiny_model, tmp_path_factory):
    """A P2P pair and a plain server of block size 64, started together; always stopped."""
    workdir = tmp_path_factory.mktemp("doctor-pair")
    port = free_port()
    odd_cmd = serve_command(tiny_model, port) + ["--block-size", "64"]  # the last one wins
    odd = ServerProcess(odd_cmd, port, engine_env(**DEV), workdir / "odd.log")
    pair = PDPair(tiny_model, workdir, env=DEV)
    try:
        pair.start(400)
        odd.wait_ready(400)
        yield pair, odd
    finally:
        odd.stop()
        pair.stop()


def doctor(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "kvscope.cli.main", "doctor", "--pair", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_the_pair_agrees_on_everything_it_exposes(servers):
    pair, _ = servers
    checks, errors = check_pair(pair.prefill.url, pair.decode.url)
    verdicts = {check.name: check.verdict for check in checks}
    assert errors == []
    for name in ("model", "block_size", "prefix_caching_hash_algo", "tensor_parallel_size"):
        assert verdicts[name] == "agree", checks
    # The layout comes from each P2P connector's side channel, found in its kv_transfer_config.
    for name in ("kv_layout", "kv_heads", "head_dim", "kv_dtype"):
        assert verdicts[name] == "agree", checks
    assert verdicts["hash_seed"] == "cannot tell"
    assert "mismatch" not in verdicts.values()
    layout = next(check for check in checks if check.name == "kv_layout")
    assert layout.prefill == "LBHNC"  # the CPU attention backend's only layout

    result = doctor(pair.prefill.url, pair.decode.url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no mismatch" in result.stdout
    assert "prefix-caching hash seed: cannot tell (prefill: not exposed" in result.stdout


def test_a_different_block_size_is_named(servers):
    pair, odd = servers
    checks, _ = check_pair(pair.prefill.url, odd.url)
    by_name = {check.name: check for check in checks}
    assert by_name["block_size"].verdict == "mismatch"
    assert (by_name["block_size"].prefill, by_name["block_size"].decode) == ("32", "64")
    assert by_name["model"].verdict == "agree"
    # No connector there, so no side channel: its layout is unknown, never assumed equal.
    assert by_name["kv_layout"].verdict == "cannot tell"
    assert "decode: no side channel" in by_name["kv_layout"].why

    result = doctor(pair.prefill.url, odd.url)
    assert result.returncode == 1
    assert "block size (tokens): MISMATCH: prefill 32, decode 64" in result.stdout
    assert "the servers disagree on block size (tokens)" in result.stdout


def test_a_server_that_does_not_answer_fails(servers):
    pair, _ = servers
    result = doctor(pair.prefill.url, f"http://127.0.0.1:{free_port()}", "--timeout", "2")
    assert result.returncode == 1
    assert "decode /v1/models: ConnectError" in result.stdout
    assert "a server did not answer /v1/models" in result.stdout
