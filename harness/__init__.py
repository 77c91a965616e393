"""The engine harness for tests, bench, verify and the demo: engines, configs, state, oracle."""
