"""Streamlit entry point: page set-up and navigation; each screen lives in app_pages/."""

from pathlib import Path

import streamlit as st

from kvscope.dashboard import ui

PAGES = Path(__file__).parent / "app_pages"

st.set_page_config(page_title="kvscope", page_icon=":material/memory:", layout="wide")
navigation = st.navigation(
    [
        st.Page(
            PAGES / "overview.py", title="Overview", icon=":material/monitoring:", default=True
        ),
        st.Page(PAGES / "blocks.py", title="Blocks", icon=":material/grid_view:"),
        st.Page(PAGES / "leases.py", title="Leases", icon=":material/lock_clock:"),
        st.Page(PAGES / "requests.py", title="Requests", icon=":material/timeline:"),
        st.Page(PAGES / "failures.py", title="Failures", icon=":material/error:"),
        st.Page(PAGES / "sizing.py", title="Sizing", icon=":material/straighten:"),
    ]
)
with st.sidebar:
    ui.backend_caption()
navigation.run()
