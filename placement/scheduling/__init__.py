"""The scheduler's parts, pure like the scheduler itself: no Django, no ORM, no I/O.

``placement.scheduler`` is the front door (``plan(snapshot) -> Plan``); the
modules here are what it is made of:

- ``types``: what the scheduler is given and what it decides.
- ``room``: the free-capacity index built from a snapshot and updated as placements are made.
- ``gpus``: which GPUs of a node a shard gets (NVLink, NUMA), and the shard's environment.
- ``place``: placing one replica of one profile (CPU, one node, several nodes).
- ``explain``: why a profile could not be placed, grouped for people.
- ``lifecycle``: what each model needs this round (desired count, idle, drain, stale, failed).
- ``coldstart``: how long a model's next start will take, from the starts measured before.
"""
