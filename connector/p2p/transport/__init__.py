"""The engine-independent NIXL transport: agent, reads, side channel, wire layout; no vLLM."""
