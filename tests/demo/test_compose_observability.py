"""Compose's Prometheus and Grafana without Docker: scrape targets, provisioning, and the
dashboard's panels and queries (their metric names against real /metrics: test_compose_metrics)."""

import json
import re

import yaml

from tests.demo.compose_files import (
    DASHBOARD,
    ENGINES,
    GRAFANA,
    PROMETHEUS,
    dashboard_metrics,
    published,
)


def test_prometheus_scrapes_both_servers_and_the_backend(services, env_file):
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = {
        name: {t for group in job["static_configs"] for t in group["targets"]}
        for name, job in jobs.items()
    }
    assert targets["vllm"] == {f"{role}:{env_file[role.upper() + '_PORT']}" for role in ENGINES}
    assert targets["kvscope-backend"] == {f"backend:{env_file['KVSCOPE_BACKEND_PORT']}"}
    roles = {group["labels"]["role"] for group in jobs["vllm"]["static_configs"]}
    assert roles == set(ENGINES), "the dashboard's queries group by role"
    prometheus = services["prometheus"]
    script = prometheus["entrypoint"][-1]
    token_file = jobs["kvscope-backend"]["authorization"]["credentials_file"]
    assert f'"$$KVSCOPE_BACKEND_TOKEN" > {token_file}' in script  # compose turns $$ into $
    assert prometheus["environment"]["KVSCOPE_BACKEND_TOKEN"] == env_file["KVSCOPE_BACKEND_TOKEN"]
    config_path = re.search(r"--config.file=(\S+)", script).group(1)
    assert f"./deploy/prometheus/prometheus.yml:{config_path}:ro" in prometheus["volumes"]
    assert any(v.endswith(":/prometheus") for v in prometheus["volumes"]), "token file's volume"
    assert 9090 in published(prometheus)


def test_grafana_provisions_prometheus_and_the_kvscope_dashboard(services, env_file):
    grafana = services["grafana"]
    mounts = dict(v.removesuffix(":ro").split(":", 1) for v in grafana["volumes"])
    (source,) = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["url"] == "http://prometheus:9090" and 9090 in published(services["prometheus"])
    (provider,) = yaml.safe_load((GRAFANA / "provisioning/dashboards/kvscope.yml").read_text())[
        "providers"
    ]
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == provider["options"]["path"] + "/kvscope.json"
    dashboard = json.loads(DASHBOARD.read_text())
    assert {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]} == {
        source["uid"]
    }
    link = services["dashboard"]["environment"]["KVSCOPE_GRAFANA_URL"]
    assert link == f"http://localhost:{env_file['GRAFANA_PORT']}/d/{dashboard['uid']}"
    assert 3000 in published(grafana)


def test_the_dashboard_shows_what_operators_look_for():
    titles = {
        p["title"]: " ".join(t["expr"] for t in p["targets"])
        for p in json.loads(DASHBOARD.read_text())["panels"]
    }
    wanted = {
        "hit rate": "vllm:kvscope_offload_hit_tokens_total",
        "bytes/s per path": "by (role, path) (rate(vllm:kvscope_offload_bytes_total",
        "leases": "vllm:kvscope_offload_active_leases",
        "failures by cause": "by (role, cause, outcome)",
        "ttft": "vllm:time_to_first_token_seconds_bucket",
        "kv wait": "vllm:kvscope_offload_kv_wait_seconds_bucket",
        "p2p: pulls": "vllm:kvscope_p2p_pulls_total",
        "p2p: nixl read": "vllm:kvscope_p2p_read_bytes_total",
    }
    for topic, query in wanted.items():
        shown = [expr for title, expr in titles.items() if topic in title.lower()]
        assert any(query in expr for expr in shown), f"no panel on {topic} queries {query}"


def test_the_dashboard_queries_kvscope_and_vllm_metrics():
    found = dashboard_metrics()
    assert any(m.startswith("vllm:kvscope_offload_") for m in found)
    assert any(m.startswith("vllm:kvscope_p2p_") for m in found)
    assert any(m.startswith("kvscope_backend_") for m in found)
    assert "vllm:time_to_first_token_seconds_bucket" in found
