"""vLLM tests that may pass bare and fail wrapped, each with its reason: what they look at is what
a wrapper cannot be, not what vLLM or a user gets from the connector. The traced wrappers have
a check of the class itself and reads of private state (connector/traced.py presents the
connector it wraps to code that holds an instance, public attributes included); kvscope's Multi
with one child is a MultiConnector, not its child, as vLLM's own MultiConnector is not. Keys are
fnmatch patterns of test ids (module::name[params]); values say which wraps the entry holds for,
and why.
"""

BUILT_FROM_THE_CONFIG = (
    "the test builds the connector, or its scheduler half, itself from the KVTransferConfig it"
    " wrote for the scheduler; under a Multi that config names the Multi and the connector's"
    " keys are its child's"
)
TOP_LEVEL_KEYS = (
    "vLLM's function reads the connector's key from the engine config's top-level"
    " kv_connector_extra_config, which under a MultiConnector (vLLM's own too) is the child's"
)
MULTI_METADATA = (
    "the test reads scheduler_output.kv_connector_metadata as the child's: a MultiConnector"
    " hands on its own metadata over its children's, as vLLM's MultiKVConnectorMetadata does"
)
NOT_ITS_CHILD = (
    "the test checks isinstance(scheduler.connector, <the child's class>) or reads the child's"
    " own attributes (connector_scheduler): a MultiConnector is not its child"
)
HMA_BY_HAND = (
    "the test builds a scheduler with the hybrid KV cache manager on and a connector that is not"
    " SupportsHMA; vLLM turns the manager off for such a config, and kvscope's Multi refuses"
    " several KV cache groups for a child that cannot take them"
)

KNOWN: dict[str, tuple[tuple[str, ...], str]] = {
    "tests.v1.kv_connector.unit.test_nixl_simple_cpu_offload::test_*_wins_*": (
        ("traced",),
        "the test reads vLLM's MultiConnector's private state (_requests_to_connector): private"
        " names stay the wrapper's own, which keeps state of its own under such names",
    ),
    "tests.v1.kv_connector.unit.test_nixl_simple_cpu_offload::test_request_finished_no_*": (
        ("traced",),
        "the test reads vLLM's MultiConnector's private state (_extra_async_saves): private"
        " names stay the wrapper's own, which keeps state of its own under such names",
    ),
    "tests.v1.kv_connector.unit.test_config::test_nixl_connector_transfer_mode*": (
        ("traced", "multi"),
        "the test checks the name of the class vLLM's factory resolves for the config (0.34:"
        " NixlPullConnector or NixlPushConnector by transfer_mode); traced, the factory"
        " resolves the traced class, whose connector is that class",
    ),
    "tests.v1.kv_connector.unit.offloading_connector.test_scheduler*::*": (
        ("multi",),
        BUILT_FROM_THE_CONFIG,
    ),
    "tests.v1.kv_connector.unit.offloading_connector.test_events::*": (
        ("multi",),
        BUILT_FROM_THE_CONFIG,
    ),
    "tests.v1.kv_connector.unit.test_decode_bench_connector::*": (
        ("multi",),
        f"{BUILT_FROM_THE_CONFIG}; or {NOT_ITS_CHILD}",
    ),
    "tests.v1.kv_connector.unit.test_simple_cpu_offload_connector::*": (
        ("multi",),
        BUILT_FROM_THE_CONFIG,
    ),
    "tests.v1.kv_connector.unit.test_simple_cpu_offload_metrics::*": (
        ("multi",),
        BUILT_FROM_THE_CONFIG,
    ),
    "tests.v1.kv_connector.unit.test_mooncake_connector::test_get_mooncake_bootstrap_addr_*": (
        ("multi",),
        TOP_LEVEL_KEYS,
    ),
    "tests.v1.kv_connector.unit.test_mooncake_connector::test_basic_interface": (
        ("multi",),
        MULTI_METADATA,
    ),
    "tests.v1.kv_connector.unit.test_mooncake_connector::test_prompt_less_than_block_size": (
        ("multi",),
        MULTI_METADATA,
    ),
    "tests.v1.kv_connector.unit.test_mooncake_connector::test_scheduler_request_finished": (
        ("multi",),
        NOT_ITS_CHILD,
    ),
    "tests.v1.kv_connector.unit.test_scheduler_kv_connector_override::*": (
        ("multi",),
        MULTI_METADATA,
    ),
    "tests.v1.kv_connector.unit.test_kv_connector_lifecycle::test_kv_connector_mixin_clears_*": (
        ("multi",),
        "the test hands the worker a metadata object of the child's type it built by hand, where"
        " the scheduler's would be the MultiConnector's",
    ),
    "tests.v1.kv_connector.unit.test_nixl_simple_cpu_offload::*": (
        ("multi",),
        "the test checks isinstance(scheduler.connector, vLLM's MultiConnector) and then reads"
        " its internals (MultiKVConnectorMetadata, _connectors): kvscope's Multi takes vLLM's"
        " name, not its class",
    ),
    "tests.v1.kv_connector.unit.test_multi_connector::test_multi_connector_children_use_*": (
        ("multi",),
        "the test checks isinstance(scheduler.connector, vLLM's MultiConnector) and then reads"
        " its children's lookahead settings: kvscope's Multi takes vLLM's name, not its class",
    ),
    "tests.v1.kv_connector.unit.offloading_connector.test_metrics::*": (
        ("multi",),
        BUILT_FROM_THE_CONFIG,
    ),
    "tests.v1.kv_connector.unit.test_config::test_sleep_mode_refuses_unsupported_kv_connector*": (
        ("multi",),
        "vLLM still refuses sleep mode for the connector, naming the configured one: under a"
        " Multi, MultiConnector, where the test matches the child's name",
    ),
    "tests.v1.kv_connector.unit.test_mooncake_connector::test_decode_*lease*": (
        ("multi",),
        MULTI_METADATA,
    ),
    "tests.v1.core.test_scheduler::test_kv_connector_*": (("multi",), MULTI_METADATA),
    "tests.v1.core.test_scheduler::test_hybrid_*": (("multi",), HMA_BY_HAND),
    "tests.v1.core.test_prefix_replay::*": (("multi",), HMA_BY_HAND),
}
"""Pattern -> (the wraps it holds for: traced, multi; why)."""
