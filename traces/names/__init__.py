"""Every span name, attribute key and event name kvscope emits: the one place they are written.

Read names.X; spans.py, events.py and attributes.py hold them by kind (bump SCHEMA_VERSION)."""

from typing import Final

# Keys reuse OpenTelemetry's `gen_ai.*` semantic conventions and vLLM's own tracing names where
# those exist; everything else lives under the `kvscope.` prefix. The backend reads spans by
# these names only, so renaming one is a protocol change: bump SCHEMA_VERSION.
from kvscope.traces.names.attributes import *  # noqa: F403
from kvscope.traces.names.events import *  # noqa: F403
from kvscope.traces.names.spans import *  # noqa: F403

SCHEMA_VERSION: Final = 1
"""Version of this naming scheme; carried as a resource attribute."""

INSTRUMENTATION_NAME: Final = "kvscope"
"""The instrumentation scope name of every kvscope tracer."""
