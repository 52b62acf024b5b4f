"""The agents' endpoints under /api/v1/agent/: registration, full reports, light heartbeats.

HTTP only: parsing, limits, refusals and answers. Taking a heartbeat is
inventory's (inventory/writes/heartbeats.py), which learns what to hand out from the
apps above it through inventory/signals.py; a full report is stored by
inventory's ingest and answered with placement's shards.
"""
