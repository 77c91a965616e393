"""The connectors' kv_connector_extra_config keys: from their config classes and key constants."""

import dataclasses
import typing
from dataclasses import dataclass

from docs.gen.code_scan import class_notes, module_notes
from docs.gen.markdown import code, page, table


@dataclass(frozen=True)
class Key:
    """One configuration key as the reference shows it."""

    name: str
    type: str
    default: str
    meaning: str


def type_name(annotation: object) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if not text or typing.get_origin(annotation) is not None:
        text = str(annotation).replace("typing.", "")
    return text.replace("NoneType", "None")


def _default(field: dataclasses.Field) -> object:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


NOTES = {
    "TierHealthConfig.max_bypass_s": "The longest bypass: failed probes double it up to this.",
    "FaultPlan.seed": "Seed of the random draws (fail_load_probability).",
}
"""Meanings of fields whose code has no comment."""


def meaning(text: str) -> str:
    text = text.removeprefix("kv_connector_extra_config key: ").removeprefix(
        "kv_connector_extra_config key "
    )
    return text[:1].upper() + text[1:]


def dataclass_keys(cls: type, prefix: str = "", extra: dict[str, str] | None = None) -> list[Key]:
    """A key per field; a field that is a dataclass itself gives prefix.field keys."""
    fallback = {k.split(".")[1]: v for k, v in NOTES.items() if k.startswith(cls.__name__ + ".")}
    notes = {**fallback, **(extra or {}), **class_notes(cls)}
    keys = []
    for field in dataclasses.fields(cls):
        default = _default(field)
        if dataclasses.is_dataclass(default):
            keys += dataclass_keys(type(default), f"{prefix}{field.name}.")
            continue
        shown = "required" if default is dataclasses.MISSING else code(repr(default))
        note = meaning(notes.get(field.name, ""))
        keys.append(Key(prefix + field.name, code(type_name(field.type)), shown, note))
    return keys


def constant_key(module, constant: str, type_: str, default: str, note: str = "") -> Key:
    """A key named by a module constant, its meaning from the constant's docstring."""
    return Key(
        getattr(module, constant),
        code(type_),
        default,
        meaning(note or module_notes(module).get(constant, "")),
    )


def offload_keys() -> list[Key]:
    from kvscope.connector.cpu_offload import config, faults, layout, shared_loads

    return [
        *dataclass_keys(
            config.OffloadConfig,
            extra={
                "cpu_bytes_to_use": "Host pool size for the whole server (vLLM's key): each of"
                " the world's TP x PP ranks allocates its share.",
                "cpu_bytes_to_use_per_rank": "Each rank's host pool size, whatever the world"
                " size (overrides the split of cpu_bytes_to_use).",
            },
        ),
        constant_key(shared_loads, "EXTRA_CONFIG_KEY", "bool", "`True`"),
        constant_key(
            layout,
            "EXTRA_LAYOUT",
            "str",
            f"`{layout.PREFERRED_LAYOUT}` on CUDA, none on the CPU",
            'The KV cache layout the connector asks vLLM for (`"none"`: no preference).',
        ),
        constant_key(
            faults,
            "EXTRA_CONFIG_PATH_KEY",
            "str",
            "none",
            "A JSON file holding a fault plan (the `faults.*` keys), re-read when it changes.",
        ),
        *dataclass_keys(faults.FaultPlan, "faults."),
    ]


def p2p_keys() -> list[Key]:
    from kvscope.connector.p2p import config, vllm_layout

    return [
        *dataclass_keys(
            config.P2PConfig,
            extra={
                "side_channel_host": "The address decode servers reach this (prefill) server's"
                f" side channel on; else ${config.HOST_ENV}.",
                "side_channel_port": "Side-channel port of TP rank 0; rank r serves on port + r"
                f" (else ${config.PORT_ENV}).",
                "lease_timeout_s": "The prefill side frees a finished request's blocks this long"
                " after it finished unless the decode side read them first.",
                "lease_margin_s": "The decode side neither starts nor accepts a read closer than"
                " this to the lease deadline (clock skew, poll delay).",
                "read_timeout_s": "A NIXL READ not done by then is failed (vLLM's"
                " kv_load_failure_policy applies).",
                "handshake_timeout_s": "The side-channel handshake with a peer, at most.",
            },
        ),
        constant_key(
            vllm_layout,
            "EXTRA_LAYOUT",
            "str",
            f"`{vllm_layout.PREFERRED_LAYOUT}`",
            'The KV cache layout the connector asks vLLM for (`"none"`: no preference).',
        ),
    ]


def multi_keys() -> list[Key]:
    from vllm.config.kv_transfer import KVTransferConfig

    from kvscope.connector.child_config import INHERITED, TRANSFER_FIELDS
    from kvscope.connector.multi import children

    keys = [
        Key(
            "connectors",
            "`list[dict]`",
            "required",
            "The children, asked in order: each a dict of the `connectors[].*` keys.",
        ),
        Key(
            "fallback",
            "`bool`",
            "`True`",
            "When the serving child's load fails, the next asynchronous child holding the blocks"
            " loads them before the failure reaches vLLM's policy.",
        ),
        Key(
            "connectors[].name",
            "`str`",
            "the child's `kv_connector`",
            module_notes(children).get("OWN_KEYS", "") + " The child's name in spans and stats.",
        ),
    ]
    notes = class_notes(KVTransferConfig)
    types = {field.name: field.type for field in dataclasses.fields(KVTransferConfig)}
    for name in sorted(TRANSFER_FIELDS):
        inherited = name in INHERITED
        default = "the Multi's" if inherited else "vLLM's"
        keys.append(Key(f"connectors[].{name}", code(type_name(types[name])), default, notes[name]))
    return keys


def traced_keys() -> list[Key]:
    from kvscope.connector import traced
    from kvscope.traces import instrumented

    return [
        constant_key(traced, "EXTRA_CONNECTOR", "str", "required"),
        constant_key(traced, "EXTRA_MODULE_PATH", "str", "vLLM's registry"),
        constant_key(
            instrumented, "EXTRA_LAYER_MODE", "str", "`$KVSCOPE_LAYER_SPANS`, else `aggregated`"
        ),
        constant_key(instrumented, "EXTRA_QUIET_HOOKS", "bool", "`False`"),
    ]


CONNECTORS = (
    ("CPU offload", "KvscopeCpuOffloadConnector", offload_keys),
    ("P2P", "KvscopeP2PConnector", p2p_keys),
    ("MultiConnector", "KvscopeMultiConnector", multi_keys),
    ("TracedConnector", "KvscopeTracedConnector", traced_keys),
)
"""Each connector's section: its title, its registered name, its keys."""


def all_keys() -> dict[str, list[Key]]:
    return {title: keys() for title, _, keys in CONNECTORS}


def render() -> str:
    sections = []
    for title, registered, keys in CONNECTORS:
        rows = [(code(k.name), k.type, k.default, k.meaning) for k in keys()]
        note = ""
        if registered != "KvscopeTracedConnector":
            note = " TracedConnector's `trace_*` keys work here too."
        sections.append(
            f'## {title}\n\n`"kv_connector": "{registered}"`.{note}\n\n'
            + table(("key", "type", "default", "meaning"), rows)
        )
    return page(
        "Connector configuration keys",
        "Every key of `kv_connector_extra_config`, per connector, read from the connectors'"
        " config classes and key constants. A dotted key is a nested dict: `tier_health.bypass_s`"
        ' is `{"tier_health": {"bypass_s": 2.0}}`. Unknown keys of `tier_health`, `faults` and a'
        " Multi's children are refused with the list of valid ones.",
        *sections,
    )
