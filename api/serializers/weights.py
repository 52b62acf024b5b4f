from rest_framework import serializers as s


class OrphanSerializer(s.Serializer):
    node = s.CharField()
    path = s.CharField()
    name = s.CharField(required=False)
    format = s.CharField(required=False)
    bytes = s.IntegerField(required=False, help_text="Absent: the agent did not report the size.")
    incomplete = s.BooleanField(required=False)


class OrphansSerializer(s.Serializer):
    orphans = OrphanSerializer(many=True)
    weights = s.IntegerField()
    nodes = s.IntegerField()
    bytes = s.IntegerField(help_text="Of the sizes reported.")


class CollectRequestSerializer(s.Serializer):
    nodes = s.ListField(child=s.CharField(), required=False, help_text="Only these nodes; omitted: every node.")


class CollectSerializer(OrphansSerializer):
    requested_at = s.DateTimeField()
    requested_by = s.CharField()
    already_pending = s.IntegerField(help_text="Of these, how many were asked for before and not yet collected.")
    note = s.CharField()
