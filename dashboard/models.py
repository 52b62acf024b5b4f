"""Models for the console (none yet)."""
