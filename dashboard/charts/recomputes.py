"""Silent recomputes on the overview: per engine and cause, requests and tokens, each request
linked to its timeline on the Requests page."""

REQUESTS_PAGE = "requests"
"""The Requests page's URL path (st.navigation names it after app_pages/requests.py)."""

LINKS_SHOWN = 10
"""Request links per row; the row's count says how many there are in all."""

_MARKDOWN_SPECIALS = "\\`*_{}[]()<>#+-.!|~"


def escaped(text: str) -> str:
    """Text as Markdown shows it literally (a request id may hold '|' or '_')."""
    return "".join(f"\\{c}" if c in _MARKDOWN_SPECIALS else c for c in text)


def request_link(item: dict) -> str:
    """A link that opens the request's timeline (the Requests page reads ?request=<row id>)."""
    return f"[{escaped(item['request_id'])}]({REQUESTS_PAGE}?request={int(item['id'])})"


def headline(found: dict) -> str | None:
    """One sentence on what the window's silent recomputes cost; None when there were none."""
    requests = found.get("requests", 0)
    if not requests:
        return None
    noun = "request was" if requests == 1 else "requests were"
    unknown = sum(row["tokens_unknown"] for row in found.get("rows", []))
    at_least = "at least " if unknown else ""
    return (
        f"{requests} {noun} answered normally although a KV load failed and vLLM recomputed "
        f"it: {at_least}{found['recomputed_tokens']:,} prefill tokens computed again."
    )


def tokens_text(row: dict) -> str:
    """A row's recomputed tokens; requests whose failed load named no token count are said."""
    if row["tokens_unknown"] >= row["requests"]:
        return "unknown"
    tokens = f"{row['recomputed_tokens']:,}"
    return tokens + (f" (+{row['tokens_unknown']} unknown)" if row["tokens_unknown"] else "")


def recomputes_table(found: dict, labels: dict[str, str]) -> str:
    """A Markdown table, one row per engine and cause, its requests as links."""
    lines = [
        "| Engine | Cause | Requests | Load failures | Tokens recomputed | Open a request |",
        "|---|---|--:|--:|--:|---|",
    ]
    for row in found.get("rows", []):
        links = ", ".join(request_link(item) for item in row["items"][:LINKS_SHOWN])
        more = row["requests"] - min(len(row["items"]), LINKS_SHOWN)
        if more > 0:
            links += f" and {more} more"
        engine = labels.get(row["engine_id"], row["engine_id"])
        lines.append(
            f"| {escaped(engine)} | {escaped(row['cause'])} | {row['requests']} | "
            f"{row['load_failures']} | {tokens_text(row)} | {links} |"
        )
    return "\n".join(lines)
