"""kvscope.traces: span names, tracer set-up and the KV connector hook instrumentation."""
