"""A stand-in for an LLM/agent call, speaking the shardops worker protocol (docs/architecture.md)."""
