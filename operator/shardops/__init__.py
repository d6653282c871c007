"""shardops: campaigns of long, flaky work split into leased, heartbeated, idempotent shards."""

__version__ = "0.1.0"
API_GROUP = "shardops.dev"
API_VERSION = "v1alpha1"
