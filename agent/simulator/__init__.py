"""Simulated fleets: many agents in one process, built from real hardware captures.

Each simulated node speaks the real agent protocol over HTTP (the same
:class:`agent.loop.AgentLoop` the real agent runs); only its reports come from
captures instead of the machine, with faults applied on demand.
"""
