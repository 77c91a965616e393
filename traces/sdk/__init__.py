"""kvscope.traces.sdk: the only code that touches the OpenTelemetry SDK."""
