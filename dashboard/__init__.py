"""The console: live pages for the fleet, nodes, NVLink racks and fabrics."""
