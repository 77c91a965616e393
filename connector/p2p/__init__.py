"""kvscope.connector.p2p: the NIXL prefill/decode connector and its engine-agnostic transport."""
