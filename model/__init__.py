"""kvscope.model: a tiny Llama with random weights and a locally trained tokenizer."""
