"""The hostile-input suite: every leaf of every body the two listeners take, mutated, against a live server."""
