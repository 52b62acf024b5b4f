"""The inventory: what each node reported at its last heartbeat.

Throughout, ``None`` (a NULL column) means *unknown*: the agent did not say,
perhaps because it is older than the field. It is never the same as empty or
zero. A node whose ``engines`` is NULL may have any engine installed; one whose
``engines`` is ``{}`` has none.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from inventory.devices import MIG_INDEX_BASE, mig_label


class NodeState(models.TextChoices):
    """What an operator wants of a node; reachability is tracked separately."""

    READY = "ready", "ready"
    CORDONED = "cordoned", "cordoned (takes nothing new)"
    DRAINING = "draining", "draining (replicas being moved off)"


class NVLinkDomain(models.Model):
    """A multi-node NVLink domain: the GPUs that joined one ClusterUUID + CliqueId.

    Created the first time a card reports it and kept when it empties, so a
    rack whose fabric manager restarts keeps its name and its history.
    """

    cluster_uuid = models.CharField(max_length=64)
    clique_id = models.BigIntegerField()
    name = models.CharField(max_length=100, blank=True, help_text="A name for people, e.g. the rack's.")
    first_seen = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        verbose_name = "NVLink domain"
        ordering = ["name", "cluster_uuid", "clique_id"]
        constraints = [
            models.UniqueConstraint(fields=["cluster_uuid", "clique_id"], name="nvlinkdomain_unique_key"),
            models.CheckConstraint(condition=Q(clique_id__gte=0), name="nvlinkdomain_clique_nonneg"),
        ]

    def __str__(self) -> str:
        return self.name or self.key

    @property
    def key(self) -> str:
        """``<ClusterUUID>/<CliqueId>``, how the API and the live groups name a domain."""
        return self.key_of(self.cluster_uuid, self.clique_id)

    @staticmethod
    def key_of(cluster_uuid: str, clique_id: int) -> str:
        """The key of the domain with these columns, for reads that fetch the columns and not the row."""
        return f"{cluster_uuid}/{clique_id}"


class Node(models.Model):
    """A machine running the agent."""

    name = models.CharField(max_length=200, unique=True, help_text="The node's identity, stable across restarts.")
    hostname = models.CharField(max_length=255, blank=True)
    mgmt_addr = models.CharField("management address", max_length=255, blank=True)
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.READY, db_index=True)
    reachable = models.BooleanField(default=True, db_index=True)
    labels = models.JSONField(default=dict, blank=True)
    agent_version = models.CharField(max_length=50, blank=True)
    os = models.CharField("OS", max_length=100, blank=True)
    os_version = models.CharField("OS version", max_length=100, blank=True)
    arch = models.CharField(max_length=32, blank=True)
    cpu_flags = models.JSONField(null=True, blank=True, help_text="NULL: not reported.")
    memory_mb = models.BigIntegerField(null=True, blank=True, help_text="NULL: not reported.")
    engines = models.JSONField(
        null=True, blank=True, help_text="Engine name → version. NULL: not reported, which is not 'none'."
    )
    disks = models.JSONField(null=True, blank=True)
    weights = models.JSONField(null=True, blank=True, help_text="Weights found on disk. NULL: not looked for.")
    fabrics = models.JSONField(null=True, blank=True, help_text="Declared fabric names → adapters.")
    imex_state = models.CharField("IMEX state", max_length=32, blank=True, help_text="Blank: not reported.")
    imex_channels = models.JSONField("IMEX channels", null=True, blank=True)
    imex_nodes = models.JSONField("IMEX nodes", null=True, blank=True)
    load = models.JSONField(null=True, blank=True, help_text="At the last heartbeat. NULL: not measured.")
    problems = models.JSONField(default=list, blank=True, help_text="What discovery could not read, in words.")
    machine_id = models.CharField(
        max_length=64, blank=True, help_text="/etc/machine-id: tells the same machine re-registering from another."
    )
    credential_digest = models.CharField(max_length=64, blank=True, editable=False, db_index=True)
    report_digest = models.CharField(max_length=64, blank=True, editable=False)
    report_error = models.CharField(
        max_length=500,
        blank=True,
        editable=False,
        help_text="Why the last full report was refused (what was stored before is kept); blank once one is taken.",
    )
    registered_at = models.DateTimeField(default=timezone.now, editable=False)
    # Not indexed, like every column a heartbeat writes: PostgreSQL then rewrites the row in its page
    # (a HOT update) and touches no index, 2,000 times a second at 10,000 nodes (migration 0014).
    last_seen = models.DateTimeField(null=True, blank=True)
    last_report_at = models.DateTimeField(null=True, blank=True)
    unreachable_since = models.DateTimeField(null=True, blank=True)
    lost = models.BooleanField(
        default=False, help_text="Silent past its grace: what is placed here is considered gone."
    )
    shard_status = models.JSONField(default=list, blank=True, help_text="Shard states at the last heartbeat.")
    health_cordon = models.TextField(
        blank=True,
        help_text="Why card health cordoned the node (inventory.health_actions); blank: it did not.",
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(memory_mb__isnull=True) | Q(memory_mb__gte=0), name="node_memory_nonneg"
            ),
            models.CheckConstraint(condition=Q(state__in=NodeState.values), name="node_state_valid"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def has_avx2(self) -> bool | None:
        """None when the CPU flags were not reported."""
        if self.cpu_flags is None:
            return None
        return "avx2" in self.cpu_flags


class GPU(models.Model):
    """A card, or a MIG instance of one (``parent_index`` set, ``index`` ≥ 1000).

    Fabric fields are blank/NULL when the card reports no fabric (most PCIe
    cards and older drivers): unknown, not failed.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveIntegerField()
    uuid = models.CharField("UUID", max_length=100, db_index=True)
    name = models.CharField(max_length=100)
    gpu_class = models.CharField("class", max_length=100, db_index=True)
    memory_mb = models.BigIntegerField(null=True, blank=True)
    pci_bus = models.CharField("PCI bus", max_length=32, blank=True)
    numa = models.IntegerField("NUMA node", null=True, blank=True)
    nvlink_peers = models.JSONField("NVLink peers", null=True, blank=True)
    nics = models.JSONField("nearest adapters", null=True, blank=True, help_text="Adapter → PIX/PXB/PHB/NODE/SYS.")
    health = models.JSONField(default=list, blank=True, help_text="Problems; empty means healthy.")
    # Memory health as the driver counts it (see agent.discovery.gpus.memory_health); NULL: unknown.
    ecc = models.JSONField(
        "ECC errors", null=True, blank=True, help_text="volatile/aggregate → SRAM/DRAM (un)correctable counts."
    )
    remapped_rows = models.JSONField(
        null=True, blank=True, help_text="Row remapper: counts, pending, failure, bank availability."
    )
    retired_pages = models.JSONField(null=True, blank=True, help_text="Single-bit, double-bit, pending.")
    # The three above as they were before they last changed, and when: what a rising counter is
    # read against (observability.sweeps, inventory.health_rules.rising).
    previous_memory = models.JSONField(null=True, blank=True)
    memory_changed_at = models.DateTimeField(null=True, blank=True)
    fabric_state = models.CharField(max_length=32, blank=True)
    fabric_status = models.CharField(max_length=64, blank=True)
    cluster_uuid = models.CharField("ClusterUUID", max_length=64, blank=True)
    clique_id = models.BigIntegerField("CliqueId", null=True, blank=True)
    fabric_health_summary = models.CharField(max_length=32, blank=True)
    fabric_bandwidth = models.CharField(max_length=64, blank=True)
    fabric_degraded = models.BooleanField(null=True, blank=True)
    fabric_problems = models.JSONField(default=list, blank=True)
    domain = models.ForeignKey(
        NVLinkDomain,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="gpus",
        help_text="The NVLink domain this card has joined; empty when it has joined none.",
    )
    mig_mode = models.CharField("MIG mode", max_length=32, blank=True, help_text="Blank: not reported.")
    parent_index = models.PositiveIntegerField(null=True, blank=True, help_text="For a MIG instance, its card.")
    mig_uuid = models.CharField("MIG UUID", max_length=100, blank=True)
    mig_profile = models.CharField("MIG profile", max_length=32, blank=True)

    class Meta:
        verbose_name = "GPU"
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node"),
            models.CheckConstraint(condition=Q(memory_mb__isnull=True) | Q(memory_mb__gte=0), name="gpu_memory_nonneg"),
            # A MIG instance carries its card's number; a card carries none.
            models.CheckConstraint(
                condition=Q(parent_index__isnull=True, index__lt=MIG_INDEX_BASE)
                | Q(parent_index__isnull=False, index__gte=MIG_INDEX_BASE),
                name="gpu_mig_numbering",
            ),
            models.CheckConstraint(
                condition=Q(parent_index__isnull=True) | ~Q(parent_index=F("index")), name="gpu_not_own_parent"
            ),
        ]
        # The MIG instances alone, by node and card: the device counts (inventory.reads.gpu_counts) find
        # the carved cards here rather than scanning every card of the fleet for the few that are carved.
        indexes = [
            models.Index(
                fields=["node", "parent_index"], condition=Q(parent_index__isnull=False), name="gpu_mig_by_card"
            ),
            # Every column the device counts read, so they scan this index (a few dozen bytes a card)
            # rather than the cards' rows (a kilobyte each, with their NVLink, ECC and fabric details).
            models.Index(
                fields=["node", "index"],
                include=["gpu_class", "parent_index", "mig_mode", "mig_uuid", "health"],
                name="gpu_device_counts",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.label}"

    @property
    def label(self) -> str:
        return mig_label(self.index)

    @property
    def is_mig_instance(self) -> bool:
        return self.parent_index is not None

    @property
    def healthy(self) -> bool:
        return not self.health


class NodeDevices(models.Model):
    """A node's devices of one class as the device counts see them, kept by PostgreSQL from the node's GPU rows.

    What the summary and ``/metrics`` would otherwise derive from every GPU
    row of the fleet on each request (eighty thousand at 10,000 nodes): the
    devices (a carved card counted as its instances), the unhealthy, the held
    back, and the rest (``open``, with their indices: what a shard may hold). A
    trigger on the GPU table recounts a node whenever a statement inserts or
    deletes its cards or changes a column the count reads (migration 0012),
    whoever writes them, so it cannot go stale; what holds them is read with
    the counts (inventory.reads.gpu_counts).
    """

    # Found by node through the unique constraint's index, which leads with it.
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_index=False)
    gpu_class = models.CharField("class", max_length=100)
    total = models.PositiveIntegerField()
    unhealthy = models.PositiveIntegerField()
    held = models.PositiveIntegerField()
    # The rest, which something may hold: how many, and their indices, below 63 as the bits of a bigint
    # (a holder's GPUs are matched with one AND) and any others (MIG instances, from 1000) as a list.
    open = models.PositiveIntegerField()
    open_bits = models.BigIntegerField()
    open_more = models.JSONField(default=list)

    class Meta:
        verbose_name_plural = "node devices"
        constraints = [models.UniqueConstraint(fields=["node", "gpu_class"], name="nodedevices_one_row_per_class")]

    def __str__(self) -> str:
        return f"{self.node_id}/{self.gpu_class}"


class IBPort(models.Model):
    """An InfiniBand or RoCE port as read from sysfs at the last full report."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="ib_ports")
    hca = models.CharField("HCA", max_length=64)
    port = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=32, blank=True)
    phys_state = models.CharField(max_length=32, blank=True)
    rate_gbps = models.FloatField(null=True, blank=True)
    link_layer = models.CharField(max_length=32, blank=True)
    node_guid = models.CharField("node GUID", max_length=32, blank=True, db_index=True)
    port_guid = models.CharField("port GUID", max_length=32, blank=True)
    sm_lid = models.PositiveIntegerField("SM LID", null=True, blank=True)
    sm_guid = models.CharField("SM GUID", max_length=32, blank=True, db_index=True)
    sm_error = models.CharField("why the SM is unknown", max_length=200, blank=True)
    network = models.CharField("RoCE network", max_length=64, blank=True)
    fabric = models.CharField("declared fabric", max_length=100, blank=True)
    counters = models.JSONField(default=dict, blank=True)
    previous_counters = models.JSONField(
        null=True, blank=True, help_text="Counters at the report before; NULL until a second report."
    )

    class Meta:
        verbose_name = "InfiniBand port"

        ordering = ["node__name", "hca", "port"]
        constraints = [
            models.UniqueConstraint(fields=["node", "hca", "port"], name="ibport_unique_per_node"),
            models.CheckConstraint(
                condition=Q(rate_gbps__isnull=True) | Q(rate_gbps__gte=0), name="ibport_rate_nonneg"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node.name} {self.hca}/{self.port}"


class SubnetManagerChange(models.Model):
    """The master SM seen by a port changed: kept, because a flapping SM is how fabrics fail."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="sm_changes")
    hca = models.CharField("HCA", max_length=64)
    port = models.PositiveSmallIntegerField()
    old_sm_guid = models.CharField(max_length=32, blank=True)
    new_sm_guid = models.CharField(max_length=32, blank=True)
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        verbose_name = "subnet manager change"
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.node.name} {self.hca}/{self.port}: {self.old_sm_guid or '?'} → {self.new_sm_guid or '?'}"


class FabricScan(models.Model):
    """The last topology scan (``ibnetdiscover``) of one physical fabric.

    A failed scan keeps the map of the last good one: ``output`` and
    ``scanned_at`` are the last success, ``error`` and ``attempted_at`` the last
    attempt when it failed. ``requested_at`` set means an operator asked for a
    scan and it has not come yet.
    """

    fabric_key = models.CharField(max_length=100, unique=True, help_text="sm:<guid> or roce:<network>")
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="scans")
    hca = models.CharField("HCA", max_length=64, blank=True)
    port = models.PositiveSmallIntegerField(null=True, blank=True)
    output = models.TextField(blank=True)
    fabric_map = models.JSONField(
        null=True,
        blank=True,
        editable=False,
        help_text="``output`` as parsed when it was kept (ibnetdiscover.map_to_json): pages read this, never the text.",
    )
    scanned_at = models.DateTimeField(null=True, blank=True)
    took_ms = models.PositiveIntegerField(null=True, blank=True)
    attempted_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    requested_at = models.DateTimeField(null=True, blank=True)
    assigned_at = models.DateTimeField(
        null=True, blank=True, help_text="When ``node`` was chosen to run the next scan."
    )
    pending_since = models.DateTimeField(null=True, blank=True, help_text="Handed to a node, not answered yet.")

    class Meta:
        ordering = ["fabric_key"]

    def __str__(self) -> str:
        return self.fabric_key


class JoinToken(models.Model):
    """A token an agent presents once to register and get its own credential.

    Rotating means issuing a new one and revoking the old; nodes already
    registered keep working, since they no longer use it.
    """

    name = models.CharField(max_length=100, default="default")
    digest = models.CharField(max_length=64, unique=True, editable=False)
    hint = models.CharField(max_length=20, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.hint})"


class FleetEvent(models.Model):
    """Something that happened to many things at once, recorded once.

    A whole NVLink domain going silent together (a fabric manager restart, a
    rack switch) is one event, not eighteen node failures; while it is open its
    nodes get a longer grace before anything on them is considered lost.

    ``partition``: more than a share of a group's nodes went silent together
    (``inventory.failure_rules``); ``subject`` names the group, ``detail``
    holds ``nodes`` and ``members``; while it is open none of those nodes is
    marked lost. ``node_unreachable`` is written each time a node goes silent
    (what flaps are counted from), ``node_flapping`` when one is cordoned for
    flapping: only silences after it count again.
    """

    class Kind(models.TextChoices):
        DOMAIN_DARK = "domain_dark", "NVLink domain went silent"
        NODE_UNREACHABLE = "node_unreachable", "node unreachable"
        NODE_LOST = "node_lost", "node lost"
        PARTITION = "partition", "group partitioned"
        NODE_FLAPPING = "node_flapping", "node cordoned for flapping"

    kind = models.CharField(max_length=32, choices=Kind.choices, db_index=True)
    subject = models.CharField(max_length=200, help_text="The node or domain it happened to.")
    domain = models.ForeignKey(NVLinkDomain, null=True, blank=True, on_delete=models.SET_NULL)
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL)
    started_at = models.DateTimeField(default=timezone.now, db_index=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=F("started_at")), name="fleetevent_ends_after"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()}: {self.subject}"

    @property
    def open(self) -> bool:
        return self.ended_at is None


class CardHealthEvent(models.Model):
    """One health problem seen on one card of a node: an Xid, or a problem that appeared in a report.

    Kept by node and card number, not by GPU row, so a card that drops out of a report (a lost
    card often does) keeps its history. inventory.health_actions counts these; rows older than
    the rules look back are deleted as new ones come.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="health_events")
    gpu_index = models.PositiveIntegerField()
    at = models.DateTimeField(db_index=True)
    severity = models.PositiveSmallIntegerField(help_text="inventory.health_rules.Severity: 0 info … 4 service.")
    what = models.TextField(help_text='The problem in words ("Xid 79: GPU has fallen off the bus").')
    xid = models.PositiveIntegerField(null=True, blank=True, help_text="The Xid code; NULL for other problems.")

    class Meta:
        ordering = ["node", "-at"]

    def __str__(self) -> str:
        return f"{self.node_id} gpu {self.gpu_index}: {self.what}"


class CardHold(models.Model):
    """A card kept out of placement by its health (inventory.health_actions), its replicas moved off.

    Lifted only once the card has been clean for the clean window; an operator can delete it.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="card_holds")
    gpu_index = models.PositiveIntegerField()
    since = models.DateTimeField()
    reason = models.TextField()

    class Meta:
        ordering = ["node", "gpu_index"]
        constraints = [models.UniqueConstraint(fields=["node", "gpu_index"], name="cardhold_one_per_card")]

    def __str__(self) -> str:
        return f"{self.node_id} gpu {self.gpu_index} held: {self.reason}"
