"""Discovery: what this machine is, read from NVML, nvidia-smi, sysfs and the IMEX and IB tools.

Django-free, and free of I/O in the parsers: each source is read by a thin
reader, and every reader can be replaced by a capture so any machine can be
replayed anywhere.
"""
