from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """What the fleet looks like from outside: metrics, the fleet summary, health, doctor sweeps.

    It reads every domain app and is read by the API and the console; it owns
    no tables (findings and task runs are stored in core, beside the audit log).
    """

    name = "observability"
    verbose_name = "Observability"
