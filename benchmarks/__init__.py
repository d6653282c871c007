"""shardops benchmarks (`make bench`): throughput against an Indexed Job and against the API server's
own write limit, API cost per shard, the scale curve, latency and memory. The scenarios are in
scenarios/ (one module each), what a run writes in results/; benchmarks/README.md maps the rest."""
