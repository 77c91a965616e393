"""kvscope.connector.cpu_offload: KV blocks kept in a host memory pool, served back as hits."""
