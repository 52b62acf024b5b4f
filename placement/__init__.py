"""Where models run: replicas and their shards, the scheduler and the reconciler."""
