"""`shardops llm`: the built-in worker command for OpenAI-compatible chat completions."""
