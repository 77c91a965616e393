"""The class-level questions vLLM asks with a KVTransferConfig alone (0.33's sleep mode, 0.34's KV
cache access and lookahead block hashes) get each stock class's answer through TracedConnector,
and through kvscope's Multi the answer vLLM's own MultiConnector gives for the same children.
kvscope's own connectors answer what they do: P2P registers the KV cache with NIXL."""

import pytest
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

from kvscope.connector.common.kv_cache_access import KVCacheAccess
from kvscope.harness import configs
from tests.conformance.recording import MODULE, RECORDING, STOCK, api_members
from tests.conformance.wrappers import WRAPPERS, inner_config, outcome, wrapper_config

QUESTIONS = ("supports_sleep_mode", "kv_cache_access", "supports_lookahead_block_hashes")
"""vLLM's classmethods that take a KVTransferConfig, in the release that added each."""

ASKED_HERE = [q for q in QUESTIONS if q in api_members()]

needs_034 = pytest.mark.skipif(
    KVCacheAccess is None, reason="this vLLM has no KVCacheAccess (added in 0.34)"
)


def answer(cls: type, question: str, kv_transfer_config: KVTransferConfig):
    """What vLLM reads (KV cache access through its factory, the others of the class), or the
    error raised: a stock class that needs its environment refuses the same way wrapped."""
    if question == "kv_cache_access":
        return outcome(KVConnectorFactory.kv_cache_access, kv_transfer_config)
    return outcome(getattr(cls, question), kv_transfer_config)


def configured(kv_transfer_config: KVTransferConfig) -> type:
    return KVConnectorFactory.get_connector_class(kv_transfer_config)


def test_each_question_this_vllm_asks_is_checked_here():
    """A classmethod vLLM adds that takes a KVTransferConfig alone needs a line in QUESTIONS."""
    import inspect

    from kvscope.traces.forwarding import API_CLASSES

    taking_a_config = {
        name
        for cls in API_CLASSES
        for name, value in vars(cls).items()
        if isinstance(value, classmethod)
        and list(inspect.signature(value.__func__).parameters)[1:] == ["kv_transfer_config"]
    }
    assert taking_a_config == set(ASKED_HERE)


@pytest.mark.parametrize("question", ASKED_HERE)
@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("stock", sorted(STOCK))
def test_a_wrapped_stock_class_answers_as_itself(question, wrapper, stock):
    own = answer(RECORDING[stock], question, inner_config(stock))
    outer = wrapper_config(wrapper, stock)
    assert answer(configured(outer), question, outer) == own


def stock_child(stock: str) -> dict:
    """A recording stock class as vLLM's MultiConnector takes a child (kv_role, no name)."""
    recording = RECORDING[stock].__name__
    return {"kv_connector": recording, "kv_connector_module_path": MODULE, "kv_role": "kv_both"}


PAIRS = [
    (stock, other) for stock in sorted(STOCK) for other in ("NixlConnector", "ExampleConnector")
]


@pytest.mark.parametrize("question", ASKED_HERE)
@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_kvscopes_multi_answers_as_vllms_multi_connector(question, first, second):
    children = [stock_child(first), stock_child(second)]
    vllms = KVTransferConfig(
        kv_connector="MultiConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"connectors": children},
    )
    ours = KVTransferConfig(**configs.multi_config(*children))
    assert answer(configured(ours), question, ours) == answer(configured(vllms), question, vllms)


def engine(config: dict) -> KVTransferConfig:
    return KVTransferConfig(**config)


@needs_034
@pytest.mark.parametrize("registered", [False, True])
def test_p2p_and_a_traced_nixl_connector_register_the_kv_cache(registered):
    """So the extensible KV cache gives each segment one physical allocation, as NIXL needs;
    the registered names come through vLLM's own plugin loading."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    registers = KVCacheAccess.REGISTERS | KVCacheAccess.EXPORTS_FABRIC
    p2p = engine(configs.p2p_config(registered=registered))
    traced_nixl = engine(
        configs.engine_config(configs.traced_child("NixlConnector", registered=registered))
    )
    assert KVConnectorFactory.kv_cache_access(p2p) == registers
    assert KVConnectorFactory.kv_cache_access(traced_nixl) == registers
    assert p2p.kv_cache_access().needs_single_chunk()


@needs_034
def test_the_offload_connector_copies_in_process_and_a_multi_ors_its_children():
    offload = engine(configs.offload_config())
    both = engine(configs.multi_config(configs.offload_child(), configs.p2p_child()))
    assert KVConnectorFactory.kv_cache_access(offload) == KVCacheAccess.IN_PROCESS
    assert KVConnectorFactory.kv_cache_access(both) == (
        KVCacheAccess.REGISTERS | KVCacheAccess.EXPORTS_FABRIC
    )


@needs_034
def test_kvscopes_connectors_hash_blocks_with_lookahead_tokens_and_a_multi_ands_its_children():
    offload, p2p = configs.offload_child(), configs.p2p_child()
    for config in (configs.offload_config(), configs.p2p_config(), configs.multi_config(offload)):
        assert configured(engine(config)).supports_lookahead_block_hashes(engine(config))
    example = configs.child("example", "ExampleConnector", None, shared_storage_path="/tmp/kv")
    mixed = engine(configs.multi_config(offload, p2p, example))
    assert not configured(mixed).supports_lookahead_block_hashes(mixed)
