"""The optional subscriber to vLLM's ZMQ KV-event streams, and its comparison with the spans."""
