from rest_framework import serializers as s

from api.serializers.common import DeviceCountSerializer


class LoadSerializer(s.Serializer):
    """A node's load at its last heartbeat; only the figures its agent sent."""

    age_seconds = s.IntegerField()
    cpu_percent = s.FloatField(required=False, help_text="Absent on an agent's first reading: unknown, not 0.")
    load1 = s.FloatField(required=False)
    load5 = s.FloatField(required=False)
    load15 = s.FloatField(required=False)
    cpus = s.IntegerField(required=False)
    memory_used_mb = s.IntegerField(required=False)
    memory_total_mb = s.IntegerField(required=False)
    memory_used_bytes = s.IntegerField(required=False, help_text="The seeds' name: memory_used_mb × 2**20.")
    memory_total_bytes = s.IntegerField(required=False, help_text="The seeds' name: memory_total_mb × 2**20.")
    memory_percent = s.FloatField(required=False)


class IBPortSerializer(s.Serializer):
    hca = s.CharField()
    port = s.IntegerField()
    state = s.CharField()
    active = s.BooleanField()
    phys_state = s.CharField(required=False)
    rate_gbps = s.FloatField(required=False)
    link_layer = s.CharField(required=False)
    fabric = s.CharField(required=False, help_text="The fabric name declared for its adapter.")
    physical = s.CharField(required=False, help_text="The fabric it is physically on: its SM, or RoCE network.")
    physical_id = s.CharField(required=False, help_text="For /api/v1/fabrics/{id}/topology.")
    sm_error = s.CharField(required=False)
    errors = s.DictField(child=s.IntegerField(), help_text="Error counters that are not zero.")
    errors_rising = s.DictField(child=s.IntegerField(), required=False, help_text="Rise since the report before.")
    tx_bytes = s.IntegerField(required=False)
    rx_bytes = s.IntegerField(required=False)


class GPUBriefSerializer(s.Serializer):
    """One card in the node listing: the seeds' GPUView names (the node's own page gives more)."""

    index = s.IntegerField(help_text="1000 + 100 × card + instance for a MIG instance.")
    label = s.CharField(help_text="3 for a card, 3/mig2 for an instance.")
    name = s.CharField()
    class_ = s.CharField()
    numa = s.IntegerField(required=False)
    nvlink_peers = s.ListField(child=s.IntegerField(), required=False)
    nearest_nic = s.CharField(required=False)
    nic_path = s.CharField(required=False)
    fabric_state = s.CharField(required=False)
    domain = s.CharField(required=False)
    bandwidth = s.CharField(required=False)

    def get_fields(self):
        fields = super().get_fields()
        fields["class"] = fields.pop("class_")
        return fields


class NodeSerializer(s.Serializer):
    """A node as ``ctl nodes`` shows it. An absent field is unknown: the agent did not say."""

    id = s.CharField(help_text="The node's name, stable across restarts.")
    state = s.CharField(help_text="ready, cordoned or draining: what an operator wants of it.")
    reachable = s.BooleanField()
    lost = s.BooleanField(help_text="Silent past its grace: what was placed here is considered gone.")
    labels = s.DictField(child=s.CharField())
    gpu_total = s.IntegerField(help_text="Devices: whole cards and MIG instances (a carved card counts as them).")
    gpu_free = s.IntegerField()
    devices = DeviceCountSerializer(many=True)
    gpu_classes = s.ListField(child=s.CharField())
    unhealthy_gpus = s.ListField(child=s.CharField(), help_text="Devices kept out of placement, and why.")
    replicas = s.IntegerField()
    warnings = s.ListField(child=s.CharField())
    hostname = s.CharField(required=False)
    mgmt_addr = s.CharField(required=False)
    agent_version = s.CharField(required=False)
    os = s.CharField(required=False)
    memory_gb = s.IntegerField(required=False)
    engines = s.ListField(child=s.CharField(), required=False, help_text="Absent: not probed, which is not 'none'.")
    models_on_disk = s.ListField(child=s.CharField(), required=False, help_text="Absent: the agent did not look.")
    fabrics = s.ListField(child=s.CharField(), required=False, help_text="Declared fabric names.")
    disk_total_gb = s.IntegerField(required=False, help_text="Local model filesystems; shared ones left out.")
    disk_free_gb = s.IntegerField(required=False)
    last_seen = s.DateTimeField(required=False)
    last_seen_ago = s.CharField(allow_blank=True, help_text='Like 45s or 3m5s (Go\'s duration); "": never seen.')
    last_seen_seconds = s.IntegerField(required=False)
    load = LoadSerializer(required=False, help_text="Absent when not measured in the last minute: unknown, not idle.")
    nvlink_domain = s.CharField(required=False, help_text="The multi-node NVLink domain every card has joined.")
    imex = s.CharField(required=False)
    imex_channels = s.IntegerField(required=False, help_text="How many IMEX channels (the seeds' type).")
    imex_channel_ids = s.ListField(child=s.IntegerField(), required=False, help_text="The IMEX channels.")
    gpus = GPUBriefSerializer(many=True)
    ib_ports = IBPortSerializer(many=True)


class NodeListedSerializer(NodeSerializer):
    """A node in the listing: every field of NodeSerializer, each present unless ``?fields=`` leaves it out."""

    def get_fields(self):
        fields = super().get_fields()
        for field in fields.values():
            field.required = False
        return fields


class GPUSerializer(s.Serializer):
    """One card or MIG instance, with how it is wired."""

    index = s.IntegerField(help_text="1000 + 100 × card + instance for a MIG instance.")
    label = s.CharField(help_text="3 for a card, 3/mig2 for an instance.")
    name = s.CharField()
    class_ = s.CharField()
    uuid = s.CharField()
    healthy = s.BooleanField()
    health = s.ListField(child=s.CharField())
    memory_mb = s.IntegerField(required=False)
    numa = s.IntegerField(required=False)
    nvlink_peers = s.ListField(child=s.IntegerField(), required=False, help_text="Empty: no active NVLink.")
    nics = s.DictField(child=s.CharField(), required=False, help_text="Adapter → PIX/PXB/PHB/NODE/SYS.")
    nearest_nic = s.CharField(required=False)
    nic_path = s.CharField(required=False)
    fabric_state = s.CharField(required=False)
    fabric_status = s.CharField(required=False)
    bandwidth = s.CharField(required=False)
    degraded = s.BooleanField(required=False)
    domain = s.CharField(required=False)
    mig_mode = s.CharField(required=False)
    parent = s.IntegerField(required=False)
    mig_profile = s.CharField(required=False)
    held_by = s.CharField(required=False, help_text="model#replica whose shard holds it.")

    def get_fields(self):
        fields = super().get_fields()
        fields["class"] = fields.pop("class_")
        return fields


class NodeShardSerializer(s.Serializer):
    id = s.CharField()
    replica = s.CharField()
    model = s.CharField()
    rank = s.IntegerField()
    gpus = s.ListField(child=s.CharField())
    state = s.CharField()
    reported_state = s.CharField(required=False, help_text="What the agent last said of it.")
    error = s.CharField(required=False)


class HeldGPUSerializer(s.Serializer):
    """A card that card health holds out of placement (inventory.health_actions)."""

    gpu = s.IntegerField()
    since = s.DateTimeField()
    reason = s.CharField(help_text="The fatal problem, in words.")


class HealthActionSerializer(s.Serializer):
    """One thing card health did on the node, from the audit log."""

    at = s.DateTimeField()
    action = s.CharField(help_text="hold-card, release-card, cordon or uncordon.")
    target = s.CharField(help_text="The node, or '<node> gpu <index>'.")
    reason = s.CharField(allow_blank=True)


class NodeDetailSerializer(NodeSerializer):
    gpus = GPUSerializer(many=True)
    shards = NodeShardSerializer(many=True)
    problems = s.ListField(child=s.CharField(), help_text="What discovery could not read.")
    disks = s.ListField(child=s.JSONField(), required=False)
    weights = s.ListField(child=s.JSONField(), required=False)
    imex_nodes = s.ListField(child=s.JSONField(), required=False)
    held_gpus = HeldGPUSerializer(many=True, help_text="Cards card health holds out of placement.")
    health_cordon = s.CharField(required=False, help_text="Why card health cordoned the node; absent: it did not.")
    health_actions = HealthActionSerializer(many=True, help_text="What card health did here, newest first.")


class NodeStateRequestSerializer(s.Serializer):
    state = s.ChoiceField(choices=["cordon", "uncordon", "drain", "ready", "cordoned", "draining"])


class NodeStateSerializer(s.Serializer):
    id = s.CharField()
    state = s.CharField()
    previous = s.CharField()


class ShardLogSerializer(s.Serializer):
    id = s.CharField()
    replica = s.CharField(required=False)
    state = s.CharField(required=False)
    lines = s.ListField(child=s.CharField(), required=False, help_text="Absent: the agent sent none.")


class NodeLogsSerializer(s.Serializer):
    node = s.CharField()
    reported_at = s.DateTimeField(required=False)
    shards = ShardLogSerializer(many=True)
