"""P/D benches: the pair of servers, its latency against vLLM's NixlConnector, its phases."""
