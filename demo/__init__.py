"""kvscope.demo: `kvscope demo` (a traced P/D pair under a workload), the quick-start, replay."""
