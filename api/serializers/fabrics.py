from rest_framework import serializers as s


class PortRefSerializer(s.Serializer):
    node = s.CharField()
    hca = s.CharField()
    port = s.IntegerField()


class SMEventSerializer(s.Serializer):
    at = s.DateTimeField()
    old = s.CharField(allow_null=True)
    new = s.CharField(allow_null=True)
    kind = s.CharField(help_text="changed (a failover) or moved (recabled between fabrics).")
    ports = s.IntegerField()
    nodes = s.ListField(child=s.CharField())
    last_at = s.DateTimeField()


class PhysicalFabricSerializer(s.Serializer):
    id = s.CharField(help_text="The key as a path can carry it: /api/v1/fabrics/{id}/topology.")
    key = s.CharField(help_text="sm:<SM GUID> or roce:<network>.")
    label = s.CharField()
    kind = s.CharField(help_text="infiniband or roce.")
    declared = s.ListField(child=s.CharField(), help_text="Names the nodes gave it, most used first.")
    nodes = s.ListField(child=s.CharField())
    ports = PortRefSerializer(many=True)
    sm_guid = s.CharField(allow_null=True)
    sm_lid = s.IntegerField(allow_null=True)
    network = s.CharField(allow_null=True)
    rate_gbps = s.FloatField(allow_null=True)
    sms = SMEventSerializer(many=True, help_text="The master SM's history, oldest first.")


class ProblemSerializer(s.Serializer):
    kind = s.CharField()
    message = s.CharField()
    fabric = s.CharField(allow_null=True)
    physical = s.CharField(allow_null=True)
    node = s.CharField(allow_null=True)
    hca = s.CharField(allow_null=True)
    port = s.IntegerField(allow_null=True)


class NodeFabricSerializer(s.Serializer):
    fabric = s.CharField(allow_null=True, help_text="The one physical fabric its live ports are on.")
    why_not = s.CharField(allow_null=True)


class FabricsSerializer(s.Serializer):
    physical = PhysicalFabricSerializer(many=True)
    problems = ProblemSerializer(many=True)
    nodes = s.DictField(child=NodeFabricSerializer())


class LivePortSerializer(s.Serializer):
    node = s.CharField()
    hca = s.CharField()
    port = s.IntegerField()
    state = s.CharField(allow_blank=True)
    phys_state = s.CharField(allow_blank=True)
    errors = s.DictField(child=s.IntegerField())
    rate_gbps = s.FloatField(required=False)
    node_guid = s.CharField(required=False)


class ScanSerializer(s.Serializer):
    node = s.CharField(allow_null=True, help_text="The node that runs this fabric's scans.")
    hca = s.CharField(allow_null=True)
    port = s.IntegerField(allow_null=True)
    scanned_at = s.DateTimeField(allow_null=True, help_text="The last scan kept; null: none yet.")
    took_ms = s.IntegerField(allow_null=True)
    attempted_at = s.DateTimeField(allow_null=True)
    error = s.CharField(allow_null=True, help_text="Why the last attempt failed; null when it did not.")
    requested_at = s.DateTimeField(allow_null=True, help_text="An operator's request not yet answered.")


class ScanRequestSerializer(s.Serializer):
    fabric = s.CharField()
    requested_at = s.DateTimeField()


class TopologySerializer(PhysicalFabricSerializer):
    problems = ProblemSerializer(many=True)
    live = LivePortSerializer(many=True)
    scan = ScanSerializer(required=False, help_text="Absent: this fabric has never been scanned.")
    map = s.DictField(child=s.JSONField(), required=False, help_text="Absent until a scan has been uploaded.")
    map_note = s.CharField(required=False)


class NVLinkCardSerializer(s.Serializer):
    index = s.IntegerField()
    label = s.CharField()
    joined = s.BooleanField()
    fabric_state = s.CharField()
    degraded = s.BooleanField()
    healthy = s.BooleanField()
    fabric_status = s.CharField(required=False)
    bandwidth = s.CharField(required=False)
    health_summary = s.CharField(required=False)
    problems = s.ListField(child=s.CharField(), required=False)


class NVLinkNodeSerializer(s.Serializer):
    node = s.CharField()
    state = s.CharField()
    reachable = s.BooleanField()
    in_domain = s.BooleanField(help_text="Every card has joined the domain.")
    ready = s.BooleanField(help_text="Nothing keeps it out of multi-node placement.")
    cards = NVLinkCardSerializer(many=True)
    out = s.ListField(child=s.CharField(), help_text="What keeps it out: cards not joined, fabric state, IMEX.")
    warnings = s.ListField(child=s.CharField(), help_text="Joined but amber: degraded bandwidth, unhealthy cards.")
    imex = s.CharField(required=False)
    imex_channels = s.ListField(child=s.JSONField(), required=False)


class NVLinkDomainSerializer(s.Serializer):
    key = s.CharField(help_text="<ClusterUUID>/<CliqueId>")
    cluster_uuid = s.CharField()
    clique_id = s.IntegerField()
    nodes_total = s.IntegerField()
    nodes_in = s.IntegerField()
    nodes_ready = s.IntegerField()
    gpus_total = s.IntegerField()
    gpus_joined = s.IntegerField()
    gpus_degraded = s.IntegerField()
    nodes = NVLinkNodeSerializer(many=True)
    name = s.CharField(required=False)


class NVLinkSerializer(s.Serializer):
    domains = NVLinkDomainSerializer(many=True)
    unassigned = NVLinkNodeSerializer(many=True, help_text="Nodes trying to join but naming no known domain.")
