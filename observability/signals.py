"""What observability tells the apps above it, without importing them: the doctor's findings changed.

The console connects to these in its AppConfig.ready() (``dashboard.receivers``).
"""

from __future__ import annotations

from django.dispatch import Signal

# A doctor sweep opened or resolved findings (sent only when ``result.changed``), after its writes
# are committed. ``sender``: core.models.Finding; ``result``: the observability.sweeps.Recorded.
findings_changed = Signal()
