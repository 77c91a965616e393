"""vLLM's ModelRunnerOutput for a hand-stepped engine step, on every supported vLLM release."""

import dataclasses
from typing import TYPE_CHECKING, NotRequired, TypedDict

from vllm.v1.outputs import ModelRunnerOutput

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput

_FIELDS = frozenset(field.name for field in dataclasses.fields(ModelRunnerOutput))


class _Fields(TypedDict):
    """The fields runner_output sets, by name."""

    req_ids: list[str]
    sampled_token_ids: list[list[int]]
    kv_connector_output: "KVConnectorOutput | None"
    req_id_to_index: NotRequired[dict[str, int]]  # vLLM 0.32 and 0.33 only


def runner_output(
    output: "SchedulerOutput", kv_output: "KVConnectorOutput | None", token_id: int = 7
) -> ModelRunnerOutput:
    """One sampled token (token_id) for each request the step scheduled, with the connector's
    output. vLLM 0.34 dropped req_id_to_index (the order of req_ids says it), so fields go by
    name."""
    req_ids = list(output.num_scheduled_tokens)
    fields: _Fields = {
        "req_ids": req_ids,
        "sampled_token_ids": [[token_id] for _ in req_ids],
        "kv_connector_output": kv_output,
    }
    if "req_id_to_index" in _FIELDS:  # vLLM 0.32 and 0.33
        fields["req_id_to_index"] = {req_id: i for i, req_id in enumerate(req_ids)}
    return ModelRunnerOutput(**fields)
