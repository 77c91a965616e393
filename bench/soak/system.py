"""Starts the demo's P/D system for the soak (no dashboard) and reads each server's state."""

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from kvscope.bench.soak.probe import STATE_FILE_ENV
from kvscope.demo.stack import Stack
from kvscope.harness.configs import child, demo_children, engine_config
from kvscope.harness.pd_system import SERVERS, PDSystemConfig, start_pd_system

PROBE_MODULE = "kvscope.bench.soak.probe"


@dataclass
class System:
    """The running services' URLs and where each server's probe writes its state."""

    urls: dict[str, str]
    state_files: dict[str, Path]
    stack: Stack

    def connector_state(self, role: str, max_age_s: float = 5.0) -> dict | None:
        """The server's own connector state, written by the probe at most max_age_s ago."""
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(self.state_files[role].read_text())
            if time.time() - state["time"] <= max_age_s:
                return state
        return None


def probe_config(
    side_channel_port: int, faults_path: Path, policy: str, tier_health: dict | None = None
) -> dict:
    """The demo's engine config, loaded through the soak's probe subclass; tier_health, when
    given, replaces the offload pool's breaker settings (connector/common/tier_health.py)."""
    offload_extra = {} if tier_health is None else {"tier_health": tier_health}
    children = demo_children(side_channel_port, faults_path, **offload_extra)
    probe = child("multi", "SoakProbeConnector", PROBE_MODULE, connectors=children)
    return engine_config(probe, policy)


def start_system(
    model: Path,
    workdir: Path,
    stack: Stack,
    policy: str,
    timeout_s: float,
    default_executor: bool = False,
    tier_health: dict | None = None,
) -> System:
    """The demo's P/D system without the dashboard (harness/pd_system.py), each server's
    connectors loaded through the soak's probe, which writes its state to a file.

    default_executor: the servers run as vLLM does by default (engine core and model worker in
    processes of their own) instead of with kvscope's VLLM_ENABLE_V1_MULTIPROCESSING=0."""
    state_files = {role: workdir / f"{role}.state.json" for role in SERVERS}
    config = PDSystemConfig(
        model=model,
        workdir=workdir,
        engine_config=lambda side_channel_port: probe_config(
            side_channel_port, workdir / "faults.json", policy, tier_health
        ),
        role_env=lambda role: {STATE_FILE_ENV: str(state_files[role])},
        default_executor=default_executor,
        timeout_s=timeout_s,
    )
    return System(start_pd_system(config, stack).urls, state_files, stack)
