"""Engine benches: tracing overhead, its switch, telemetry isolation, hook times, TTFT, convoys."""
