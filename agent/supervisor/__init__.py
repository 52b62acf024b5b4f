"""Running shards on this node: fetching weights, starting engines, watching them, stopping them.

- ``spec``: a shard as the heartbeat answer describes it.
- ``fetch``: weights from hf://, file:// or https://, with progress.
- ``vllm``, ``sglang``, ``llamacpp``: each engine's command line, in one place per engine.
- ``supervisor``: the shards this node runs, their processes, logs and states.

Django-free, like the rest of the agent.
"""
