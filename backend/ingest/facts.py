"""Facts: the rows the derive stage makes of one batch, grouped by the table they go to."""

from dataclasses import dataclass, field


@dataclass
class Facts:
    """Rows to write for one batch, grouped by table."""

    spans: list[tuple] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    request_stubs: list[dict] = field(default_factory=list)
    points: list[tuple] = field(default_factory=list)  # request_rows.POINT_COLUMNS order
    transfers: list[dict] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    lookups: list[dict] = field(default_factory=list)
    latencies: list[dict] = field(default_factory=list)
    leases: list[dict] = field(default_factory=list)
    blocks: list[dict] = field(default_factory=list)
    # origin -> runs of the batch's seq numbers (lo, hi, lo_start_ns, hi_start_ns): db.seqs
    seqs: dict[str, list[tuple[int, int, int, int]]] = field(default_factory=dict)
    telemetry: dict[str, tuple[int, int | None, int | None]] = field(default_factory=dict)
    # origin -> (service name, engine id, kv role) of the process that numbered the spans
    origins: dict[str, tuple[str | None, str | None, str | None]] = field(default_factory=dict)
    stub_keys: set[tuple[str, str | None]] = field(default_factory=set)
    # Row counts before the current span: ordinals count within one span, so a span sent
    # twice (an exporter retry) yields the same keys and is stored once.
    points_before: int = 0
    failures_before: int = 0
