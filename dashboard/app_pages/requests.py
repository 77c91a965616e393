"""Requests: a searchable table; one request's spans as a Gantt chart, its KV timeline and TTFT."""

import streamlit as st

from kvscope.dashboard import client, transport_sections, ui
from kvscope.dashboard.charts import convoys, health, tables, timeline
from kvscope.dashboard.charts import misses as misses_charts
from kvscope.dashboard.charts.format import clock
from kvscope.dashboard.settings import get_settings, jaeger_trace_url

st.title("Requests")
search_box, status_box = st.columns([3, 1])
search = search_box.text_input("Search", placeholder="request id, or part of it", key="search")
status = status_box.selectbox(
    "Status", ["any", "running", "finished_stopped", "finished_length_capped", "error"]
)


def matching_requests(version: int) -> list[dict]:
    """Recent requests whose id contains the search text; an exact id also finds older ones."""
    status_filter = None if status == "any" else status
    recent = client.requests(version, limit=1000, status=status_filter)["items"]
    needle = search.strip()
    found = [r for r in recent if needle in (r["request_id"] or "")]
    if needle and not found:
        found = client.requests(version, request_id=needle, status=status_filter)["items"]
    return found


def request_picker(found: list[dict]) -> int:
    """The opened request: ?request=<key> in the URL (so it can be linked) or the picker."""
    keys = [r["id"] for r in found]
    labels = {r["id"]: f"{r['request_id']} · {r['status']} · {clock(r['start_ns'])}" for r in found}
    wanted = st.query_params.get("request")
    if wanted and wanted.isdigit() and int(wanted) in keys:
        st.session_state.setdefault("open_request", int(wanted))
    if st.session_state.get("open_request") not in keys:
        st.session_state.pop("open_request", None)
    key = st.selectbox("Open a request", keys, format_func=labels.__getitem__, key="open_request")
    assert key is not None  # the page shows no picker without requests
    st.query_params["request"] = str(key)
    return key


def request_header(request: dict) -> None:
    st.subheader(f"Request {request['request_id']}")
    duration = request["duration_ms"]
    st.write(
        f"{request['status']} · {request['connector']} ({request['kv_role']}) · "
        f"{request['prompt_tokens'] or '?'} prompt tokens · "
        f"{'running' if duration is None else f'{duration:.1f} ms'}"
    )
    link = jaeger_trace_url(get_settings().jaeger_url, request["trace_id"])
    if link:
        st.link_button("Open this trace in Jaeger", link, icon=":material/open_in_new:")


def ttft_breakdown(found: dict) -> None:
    ttft = found["ttft"]
    parts = timeline.ttft_frame(ttft)
    total = ttft["ttft_ms"]
    st.markdown(f"**Time to first token:** {'unknown' if total is None else f'{total:.1f} ms'}")
    if not parts.empty:
        ui.chart(timeline.ttft_chart(parts))
        st.dataframe(parts, hide_index=True)


def gantt(version: int, found: dict) -> None:
    request = found["request"]
    spans = client.spans(version, request["id"])
    bars = timeline.gantt_frame(spans, request["start_ns"])
    points = timeline.points_frame(found, request["start_ns"])
    mixed_clocks(version, {span.get("engine_id") for span in spans})
    st.markdown("**Spans and KV timeline points** (dashed lines; hover for names)")
    ui.chart(timeline.gantt_chart(bars, points))
    if waited := convoys.request_caption(spans):
        st.caption(waited)
    if found["missing_points"]:
        st.caption(f"Points not seen for this request: {', '.join(found['missing_points'])}")
    with st.expander("Timeline points"):
        st.dataframe(points, hide_index=True)


def mixed_clocks(version: int, engine_ids: set) -> None:
    """This timeline joins hosts whose clocks differ: say how far its order can be off."""
    clocks = client.clocks(version)
    warning = clocks and health.mixed_clocks_warning(
        clocks, engine_ids - {None}, client.engine_labels(version)
    )
    if warning:
        st.warning(warning, icon=":material/schedule:")


def why_missed(version: int, request: dict) -> None:
    """The request's prompt tokens no tier served, by reason."""
    found = client.request_misses(version, request["id"])
    if found is None:
        return
    st.markdown(
        f"**Why tokens missed:** {found['missed_tokens']:,} of {found['prompt_tokens']:,} "
        f"prompt tokens no tier served"
    )
    if found["violation"]:
        st.error(found["violation"], icon=":material/calculate:")
    st.markdown(misses_charts.request_table(found))


def transfers_and_failures(found: dict) -> None:
    left, right = st.columns(2)
    left.markdown("**Transfers**")
    left.dataframe(tables.transfers_table(found["transfers"]), hide_index=True)
    right.markdown("**Failures**")
    right.dataframe(tables.failures_table(found["failures"]), hide_index=True)


@ui.live
def request_page(version: int) -> None:
    found = matching_requests(version)
    if not found:
        ui.no_data("No request matches." if search else "Requests appear as engines serve them.")
        return
    labels = client.engine_labels(version)
    st.dataframe(tables.requests_table(found, labels), hide_index=True, height=240)
    detail = client.timeline(version, request_picker(found))
    request_header(detail["request"])
    ui.certainty_warning(detail["certainty"])
    ttft_breakdown(detail)
    transport_sections.request_transport(version, detail["request"])
    gantt(version, detail)
    why_missed(version, detail["request"])
    transfers_and_failures(detail)
