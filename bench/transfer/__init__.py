"""Transfer benches: the offload copy engine and NIXL reads against raw copies, the GPU checks."""
