"""The admin API's views, one module per kind of thing; each view is a few lines over a shared function."""
