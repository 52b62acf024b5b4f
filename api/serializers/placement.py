from rest_framework import serializers as s


class FetchSerializer(s.Serializer):
    source = s.CharField(allow_blank=True)
    bytes_done = s.IntegerField()
    bytes_total = s.IntegerField(required=False, help_text="Absent when the source did not say.")
    percent = s.IntegerField(required=False, help_text="Absent rather than invented when the total is unknown.")


class ShardSerializer(s.Serializer):
    id = s.CharField()
    node = s.CharField()
    rank = s.IntegerField()
    gpus = s.ListField(child=s.IntegerField())
    gpu_labels = s.ListField(child=s.CharField())
    state = s.CharField()
    error = s.CharField(required=False)
    fetch = FetchSerializer(required=False, help_text="The download it waits on; absent when none.")


class ReplicaSerializer(s.Serializer):
    id = s.CharField()
    model = s.CharField()
    profile = s.CharField()
    stale = s.BooleanField(help_text="The profile was edited since placement: reported, not restarted.")
    state = s.CharField()
    age_seconds = s.IntegerField()
    idle_seconds = s.IntegerField(help_text="-1: nothing has been routed to it yet, which is not idle.")
    gpus = s.IntegerField()
    shards = ShardSerializer(many=True)
    pool = s.CharField(required=False)
    fabric = s.CharField(required=False)
    nvlink_domain = s.CharField(required=False)
    endpoint = s.CharField(required=False)
    error = s.CharField(required=False)
    replaces = s.CharField(required=False)


class RejectionSerializer(s.Serializer):
    profile = s.CharField(allow_blank=True)
    reason = s.CharField(allow_blank=True)
    pool = s.CharField(required=False)
    node = s.CharField(required=False)
    nodes = s.IntegerField(required=False, help_text="How many candidates this line stands for.")


class AutoscaleLoadSerializer(s.Serializer):
    in_flight = s.IntegerField(help_text="Requests on the model's replicas, summed over every gateway worker.")
    waiting = s.IntegerField(help_text="Requests waiting for a replica to be ready.")
    tokens_per_second = s.FloatField(help_text="Completion tokens per second over the last ten seconds.")
    time_to_first_token_ms = s.FloatField(required=False, help_text="Absent: no request ended in the window.")
    workers = s.IntegerField(help_text="Gateway workers whose reports were summed.")
    source = s.CharField(help_text="redis, database (Redis down or not configured), redis+database, or none.")


class AutoscaleCapacitySerializer(s.Serializer):
    profile = s.CharField(allow_blank=True)
    concurrency = s.IntegerField(help_text="Requests one replica serves at once.")
    tokens_per_second = s.FloatField(required=False)
    measured = s.BooleanField(help_text="False: a default (LLMGW_AUTOSCALE_DEFAULT_CONCURRENCY), none was measured.")


class ScaleEventSerializer(s.Serializer):
    at = s.DateTimeField()
    to = s.IntegerField()
    direction = s.CharField()
    reason = s.CharField()

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = s.IntegerField()
        return fields


class AutoscaleSerializer(s.Serializer):
    desired = s.IntegerField(help_text="Replicas the load wants, within [min, max].")
    direction = s.CharField(help_text="up, down or hold: what the last decision did.")
    reason = s.CharField(help_text="The decision in numbers.")
    decided_at = s.DateTimeField()
    changed_at = s.DateTimeField(required=False, help_text="When the count last changed; absent: never.")
    replicas = s.IntegerField(help_text="Replicas running when it decided.")
    load = AutoscaleLoadSerializer()
    capacity = AutoscaleCapacitySerializer()
    history = ScaleEventSerializer(many=True, required=False, help_text="The latest changes, newest first.")


class StartTimeoutSerializer(s.Serializer):
    replica = s.CharField()
    nodes = s.ListField(child=s.CharField())
    at = s.DateTimeField(help_text="When the reconciler failed it.")
    waited_s = s.IntegerField(help_text="Seconds since it was placed, then.")
    deadline_s = s.IntegerField()
    reason = s.CharField(help_text="The deadline and what it followed, in a sentence.")


class ExplainSerializer(s.Serializer):
    model = s.CharField()
    placed = s.BooleanField(help_text="The model has replicas serving or on their way.")
    rejections = RejectionSerializer(many=True)
    satisfied = s.BooleanField(required=False, help_text="It has as many replicas as it wants.")
    computed_at = s.DateTimeField(required=False, help_text="Absent: the reconciler has not looked at it yet.")
    note = s.CharField(required=False)
    autoscale = AutoscaleSerializer(required=False, help_text="Absent: not autoscaled (max = min), or not yet decided.")
    start_timeouts = StartTimeoutSerializer(
        many=True,
        required=False,
        help_text="The latest replicas failed for not being ready by their start deadline, newest first; absent: none.",
    )


class WhatIfTargetSerializer(s.Serializer):
    target = s.CharField(help_text="As given.")
    kind = s.ChoiceField(choices=["node", "nvlink_domain", "fabric", "label"], help_text="What it was read as.")
    key = s.CharField(help_text="The node, domain key (ClusterUUID/CliqueId), fabric key, or LABEL=VALUE.")
    nodes = s.ListField(child=s.CharField(), help_text="The nodes it holds now.")


class WhatIfShardSerializer(s.Serializer):
    node = s.CharField()
    gpus = s.ListField(child=s.IntegerField())
    gpu_labels = s.ListField(child=s.CharField())


class WhatIfPlacementSerializer(s.Serializer):
    profile = s.CharField()
    nodes = s.ListField(child=s.CharField())
    shards = WhatIfShardSerializer(many=True)
    interconnect = s.ChoiceField(
        choices=["single_node", "nvlink", "infiniband"],
        help_text="How its shards would talk: one node, one multi-node NVLink domain, or one InfiniBand fabric.",
    )
    nvlink_domain = s.CharField(required=False)
    fabric = s.CharField(required=False)
    pool = s.CharField(required=False)


class WhatIfStoppedSerializer(s.Serializer):
    replica = s.CharField()
    model = s.CharField()
    profile = s.CharField()
    state = s.CharField()
    nodes = s.ListField(child=s.CharField(), help_text="Its shards' nodes, by rank.")
    lost_nodes = s.ListField(child=s.CharField())
    needed = s.BooleanField(help_text="The model would be short without a replacement.")
    to = WhatIfPlacementSerializer(required=False, help_text="Where the scheduler would put one instead.")
    why = s.CharField(required=False, help_text="Why none would be placed; absent when one would.")


class WhatIfShortSerializer(s.Serializer):
    model = s.CharField()
    wanted = s.IntegerField()
    after = s.IntegerField(help_text="Replicas it would have: those left and those placed.")
    short_today = s.BooleanField(help_text="Short already, before anything is lost.")
    parked = s.BooleanField()
    reasons = RejectionSerializer(many=True, help_text="The scheduler's explanation, as explain-placement gives it.")


class WhatIfMovesSerializer(s.Serializer):
    count = s.IntegerField(help_text="Replacements the scheduler would place.")
    per_minute = s.IntegerField(help_text="LLMGW_MOVES_PER_MINUTE.")
    minutes = s.IntegerField(help_text="One-minute windows the moves need at that rate: ceil(count / per_minute).")


class WhatIfSerializer(s.Serializer):
    lose = WhatIfTargetSerializer(many=True)
    lost_nodes = s.ListField(child=s.CharField())
    stopped = WhatIfStoppedSerializer(many=True)
    short = WhatIfShortSerializer(many=True)
    moves = WhatIfMovesSerializer()
    note = s.CharField()
