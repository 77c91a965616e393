"""Fake CUDA streams and events for CudaCopyEngine on the CPU: copies run at once, but an
event completes only when the test lets its stream "run", as a busy GPU would."""

import contextlib
from dataclasses import dataclass, field


@dataclass
class FakeEvent:
    gpu: "FakeGpu"
    stream: "FakeStream | None" = None
    done: bool = False

    def record(self, stream: "FakeStream") -> None:
        self.stream, self.done = stream, False
        stream.events.append(self)

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        """The host waits for the GPU: counted, then the stream runs up to this event."""
        self.gpu.host_syncs += 1
        if self.stream is not None:
            self.stream.run(until=self)

    def elapsed_time(self, other: "FakeEvent") -> float:
        return 1.0


@dataclass
class FakeStream:
    name: str
    priority: int
    events: list[FakeEvent] = field(default_factory=list)
    waited_on: list[object] = field(default_factory=list)  # streams and events, in order

    def wait_stream(self, other: "FakeStream") -> None:
        self.waited_on.append(other)

    def wait_event(self, event: FakeEvent) -> None:
        self.waited_on.append(event)

    def run(self, until: FakeEvent | None = None) -> None:
        """Completes the recorded events in order, up to `until` (all by default)."""
        for event in self.events:
            event.done = True
            if event is until:
                break
        self.events = [event for event in self.events if not event.done]

    def synchronize(self) -> None:
        self.run()


class FakeGpu:
    """StreamOps for CudaCopyEngine; priorities as CUDA's: a larger number is lower."""

    PRIORITY_RANGE = (0, -5)  # (lowest, highest), as torch.cuda.Stream.priority_range() on H100

    def __init__(self) -> None:
        self.compute = FakeStream("compute", 0)
        self.streams: list[FakeStream] = []
        self.host_syncs = 0

    def new_stream(self) -> FakeStream:
        stream = FakeStream(f"copy{len(self.streams)}", self.PRIORITY_RANGE[0])
        self.streams.append(stream)
        return stream

    def current_stream(self) -> FakeStream:
        return self.compute

    def new_event(self) -> FakeEvent:
        return FakeEvent(self)

    def use_stream(self, stream: FakeStream) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def run_all(self) -> None:
        for stream in self.streams:
            stream.run()
