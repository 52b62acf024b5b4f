"""The agents' endpoints under /api/v1/agent/: registration, full reports, light heartbeats.

Project-level glue rather than part of one app: answering a heartbeat reads
inventory (who is this) and placement (what should it run), and neither app
should import the other for it.
"""
