"""Span and trace ids: never repeated across processes, whatever vLLM does to `random`."""

import multiprocessing
import random

from kvscope.traces.sdk.processors import SystemRandomIdGenerator


def _child_ids(generator: SystemRandomIdGenerator, queue) -> None:
    queue.put([generator.generate_span_id() for _ in range(4)])


def test_seeding_python_random_does_not_repeat_ids():
    first, second = SystemRandomIdGenerator(), SystemRandomIdGenerator()
    random.seed(0)
    ids = {first.generate_span_id(), first.generate_trace_id()}
    random.seed(0)
    assert not ids & {second.generate_span_id(), second.generate_trace_id()}


def test_a_forked_child_draws_other_ids_than_its_parent():
    generator = SystemRandomIdGenerator()
    queue = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=_child_ids, args=(generator, queue))
    child.start()
    child_ids = queue.get(timeout=30)
    child.join(timeout=30)
    parent_ids = [generator.generate_span_id() for _ in range(4)]
    assert not set(child_ids) & set(parent_ids)
    assert all(0 < i < 2**64 for i in child_ids + parent_ids)
