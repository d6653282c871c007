"""shardops benchmarks (`make bench`): throughput against an Indexed Job and against the API server's
own write limit, API cost per shard, the scale curve, latency and memory. See benchmarks/README.md."""
