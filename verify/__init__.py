"""kvscope verify: checks a KV connector against vLLM's connector contract on real engines."""
