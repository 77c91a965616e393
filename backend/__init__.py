"""kvscope.backend: OTLP receiver, SQL store of KV state and timelines, REST and WebSocket API."""
