"""The offload connector's copy engine: a CPU thread or CUDA streams, staging, the host buffer."""
