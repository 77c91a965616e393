"""Dashboard settings, read from the environment: where the backend is and how often to poll."""

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_BACKEND_URL = "http://127.0.0.1:4318"


class DashboardSettings(BaseSettings):
    """KVSCOPE_BACKEND_URL, KVSCOPE_BACKEND_TOKEN, KVSCOPE_JAEGER_URL, KVSCOPE_GRAFANA_URL,
    KVSCOPE_DASHBOARD_*."""

    model_config = SettingsConfigDict(env_prefix="KVSCOPE_DASHBOARD_", populate_by_name=True)

    backend_url: str = Field(DEFAULT_BACKEND_URL, validation_alias="KVSCOPE_BACKEND_URL")
    # The dashboard only reads, so a token limited to reading is enough.
    backend_token: str | None = Field(None, validation_alias="KVSCOPE_BACKEND_TOKEN")
    jaeger_url: str | None = Field(None, validation_alias="KVSCOPE_JAEGER_URL")
    # The provisioned kvscope dashboard in Grafana (Prometheus metrics), linked from the sidebar.
    grafana_url: str | None = Field(None, validation_alias="KVSCOPE_GRAFANA_URL")
    # Live parts poll this often; a change shows within about this long.
    refresh_s: float = 1.0
    timeout_s: float = 5.0


@lru_cache
def get_settings() -> DashboardSettings:
    return DashboardSettings()


def jaeger_trace_url(jaeger_url: str | None, trace_id: str) -> str | None:
    """Link to the same trace in Jaeger's UI, when Jaeger is configured."""
    if not jaeger_url:
        return None
    return f"{jaeger_url.rstrip('/')}/trace/{trace_id}"
