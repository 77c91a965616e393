"""Starts the demo's processes, waits until each is healthy, and stops every one of them."""

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Service:
    """One process of the demo: its command, environment, log file and health URL."""

    name: str
    cmd: list[str]
    env: dict[str, str]
    health_url: str
    log_path: Path
    process: subprocess.Popen | None = None

    @property
    def started(self) -> subprocess.Popen:
        """The process start() started."""
        if self.process is None:
            raise RuntimeError(f"{self.name} was not started")
        return self.process

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.cmd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def healthy(self) -> bool:
        with contextlib.suppress(OSError), urllib.request.urlopen(self.health_url, timeout=2) as r:
            return r.status == 200
        return False

    def terminate(self) -> None:
        """SIGTERM to the process group, if it still runs."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)

    def stop(self, timeout_s: float = 20) -> None:
        """SIGTERM to the process group, SIGKILL after timeout_s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


@dataclass
class Stack:
    """The services, started in order; stop() ends all of them, newest first."""

    services: list[Service] = field(default_factory=list)

    def start(self, service: Service, timeout_s: float = 300) -> None:
        print(f"  starting {service.name} ... ", end="", flush=True)
        self.services.append(service)
        service.start()
        started = time.monotonic()
        while not service.healthy():
            if service.started.poll() is not None:
                raise RuntimeError(f"{service.name} exited; its log: {service.log_path}")
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(
                    f"{service.name} not healthy in {timeout_s:.0f} s; see {service.log_path}"
                )
            time.sleep(0.5)
        print(f"ready in {time.monotonic() - started:.0f} s", flush=True)

    def start_together(self, services: list[Service], timeout_s: float = 300) -> None:
        """Starts the services at once (two vLLM servers start in about the time of one) and
        waits until every one is healthy."""
        print(f"  starting {', '.join(s.name for s in services)} ... ", end="", flush=True)
        started = time.monotonic()
        for service in services:
            self.services.append(service)
            service.start()
        waiting = list(services)
        while waiting:
            self.check_alive()
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(
                    f"{waiting[0].name} not healthy in {timeout_s:.0f} s; see {waiting[0].log_path}"
                )
            waiting = [s for s in waiting if not s.healthy()]
            time.sleep(0.5)
        print(f"ready in {time.monotonic() - started:.0f} s", flush=True)

    def check_alive(self) -> None:
        for service in self.services:
            if service.started.poll() is not None:
                raise RuntimeError(f"{service.name} exited; its log: {service.log_path}")

    def stop(self) -> None:
        """SIGTERM to every service at once (a vLLM server takes seconds to exit), then each is
        waited for, newest first, and SIGKILLed if it is still there."""
        for service in self.services:
            service.terminate()
        for service in reversed(self.services):
            service.stop()

    def pids(self) -> list[int]:
        return [s.process.pid for s in self.services if s.process is not None]
