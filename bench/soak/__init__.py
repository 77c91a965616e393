"""The soak: the P/D + offload system under thousands of requests, aborts and faults, checked."""
