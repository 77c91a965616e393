"""kvscope.deploy: the Grafana dashboard and provisioning, Prometheus and Collector configs."""

import shutil
from importlib import resources
from pathlib import Path

FILES = (
    "grafana/dashboards/kvscope.json",
    "grafana/provisioning/dashboards/kvscope.yml",
    "grafana/provisioning/datasources/prometheus.yml",
    "prometheus/prometheus.yml",
    "prometheus/alerts.yml",
    "otel-collector/fleet.yaml",
)
"""Every file shipped here, by its path under deploy/ (docker-compose.yml mounts the same)."""

GRAFANA_DASHBOARD = FILES[0]


def read(name: str) -> str:
    """One shipped file's text, from the installed package or the checkout."""
    if name not in FILES:
        raise KeyError(f"no deploy file {name!r}; there are {', '.join(FILES)}")
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def write_all(out: Path) -> list[Path]:
    """Copies every shipped file under out (keeping the grafana/ and prometheus/ tree)."""
    written = []
    for name in FILES:
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        with resources.as_file(resources.files(__name__).joinpath(name)) as source:
            shutil.copyfile(source, target)
        written.append(target)
    return written
