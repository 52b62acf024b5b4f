"""What should run: models, their profiles, aliases, fallbacks, scaling and measured capacity."""
