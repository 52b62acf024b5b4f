from rest_framework import serializers as s


class ErrorSerializer(s.Serializer):
    error = s.CharField(help_text="What went wrong, and what to do about it, in one sentence.")


class DeviceCountSerializer(s.Serializer):
    """Devices of one class: a whole card, or a MIG instance under its own class."""

    class_ = s.CharField(help_text="e.g. h100-80g, a100-80g-mig-3g.40gb")
    total = s.IntegerField()
    used = s.IntegerField(help_text="Held by a replica's shard.")
    free = s.IntegerField()
    unhealthy = s.IntegerField(help_text="Neither used nor free: counting them as free is how a fleet looks bigger.")
    held = s.IntegerField(help_text="Healthy but out of placement (a MIG card with no instances, …).")

    def get_fields(self):
        fields = super().get_fields()
        fields["class"] = fields.pop("class_")
        return fields


ERRORS = {400: ErrorSerializer, 401: ErrorSerializer, 403: ErrorSerializer}
WRITE_ERRORS = {**ERRORS, 404: ErrorSerializer, 409: ErrorSerializer, 413: ErrorSerializer}
