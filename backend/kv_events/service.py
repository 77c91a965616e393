"""Starting and stopping the KV-event subscriber with the app, when KVSCOPE_KV_EVENTS is set."""

from fastapi import FastAPI

from kvscope.backend.settings import Settings


def start(app: FastAPI, settings: Settings) -> None:
    """Subscribes to every stream the setting names (app.state.kv_events; None: none named)."""
    app.state.kv_events = None
    if not settings.kv_events.strip():
        return
    from kvscope.backend.kv_events.subscriber import KVEventSubscriber, parse_endpoints

    endpoints = parse_endpoints(settings.kv_events)
    app.state.kv_events = KVEventSubscriber(endpoints, settings.kv_events_topic).start()


def stop(app: FastAPI) -> None:
    if (subscriber := getattr(app.state, "kv_events", None)) is not None:
        subscriber.stop()
