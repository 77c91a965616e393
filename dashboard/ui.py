"""Shared screen parts: the live section wrapper, backend states, empty states, warnings."""

from collections.abc import Callable
from typing import Literal

import streamlit as st

from kvscope.dashboard import client
from kvscope.dashboard.settings import get_settings

WINDOWS = {"1 min": 60.0, "5 min": 300.0, "15 min": 900.0, "1 h": 3600.0, "24 h": 86400.0}


def live(render: Callable[[int], None]) -> None:
    """Runs render(data_version) now and again every refresh_s, without reloading the page;
    an unreachable backend or a refused token shows as a clear state instead of a crash."""

    @st.fragment(run_every=get_settings().refresh_s)
    def live_section() -> None:
        try:
            render(client.data_version())
        except client.BackendUnreachable as error:
            backend_unreachable(error)
        except client.BackendRefused as error:
            backend_refused(error)

    live_section()


def backend_unreachable(error: Exception) -> None:
    url = get_settings().backend_url
    st.error(
        f"**Backend unreachable** at {url}: {error}\n\n"
        "Start it with `kvscope backend` (or `python -m kvscope.backend`), or point the "
        "dashboard at it with `KVSCOPE_BACKEND_URL`. This page retries every second.",
        icon=":material/cloud_off:",
    )


def backend_refused(error: Exception) -> None:
    st.error(
        f"**The backend refused the dashboard's token**: {error}\n\n"
        "Set `KVSCOPE_BACKEND_TOKEN` to the backend's token and restart the dashboard.",
        icon=":material/lock:",
    )


def no_data(message: str) -> None:
    st.info(f"**No data yet.** {message}", icon=":material/hourglass_empty:")


def certainty_warning(certainty: dict | None) -> None:
    """States rebuilt from a span stream with holes may be stale: say so and why."""
    if not certainty or certainty.get("complete", True):
        return
    missing = sum(gap["count"] for gap in certainty["gaps"])
    st.warning(
        f"{missing} spans of {len({g['origin'] for g in certainty['gaps']})} process(es) are "
        "missing or still on their way: states below may be stale.",
        icon=":material/warning:",
    )


def window_picker(key: str = "window") -> float:
    label = st.segmented_control(
        "Window", list(WINDOWS), default="15 min", key=key, label_visibility="collapsed"
    )
    return WINDOWS[label or "15 min"]


def backend_caption() -> None:
    settings = get_settings()
    st.caption(f"Backend: {settings.backend_url} · refresh every {settings.refresh_s:g} s")
    if settings.grafana_url:
        st.link_button("Metrics in Grafana", settings.grafana_url, icon=":material/query_stats:")


def chart(figure, stretch: bool = True, height: int | None = None, **options):
    """st.altair_chart at the height the builder chose (Streamlit ignores the spec's own)."""
    shown: int | Literal["content"] = height or (
        figure.height if isinstance(figure.height, int) else "content"
    )
    width: Literal["stretch", "content"] = "stretch" if stretch else "content"
    return st.altair_chart(figure, width=width, height=shown, **options)
