"""Where a model's weights already are, as a tie-break between equally good candidates.

A replica that lands where its weights are on disk starts without a fetch; one
that lands on a fabric where another node holds them fetches from close by.
Neither ever outranks the existing criteria (the tightest node, the best GPU
locality, the smallest domain or fabric): the scheduler makes its choice as
before, then, among the candidates exactly as good by those criteria, takes
the warmest. So weights change which of several equal nodes is chosen, never
how many replicas are placed or how well.

Warmth, best first: ``LOCAL`` (the node holds a complete copy), ``FABRIC``
(another node on its InfiniBand fabric does), ``COLD`` (neither).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

LOCAL, FABRIC, COLD = 0, 1, 2

# How many holders a note names before "…".
NAMED = 3


class Warmth:
    """Which nodes hold which model's weights, and the fabrics those nodes are on."""

    __slots__ = ("_fabric_of", "_fabrics", "_holders")

    def __init__(self, holders: Mapping[str, Collection[str]], fabric_of: Mapping[str, str | None]) -> None:
        # Only nodes the snapshot knows count: a lost node's disk helps nobody.
        self._holders = {m: frozenset(n for n in nodes if n in fabric_of) for m, nodes in holders.items()}
        self._fabric_of = fabric_of
        self._fabrics: dict[str, frozenset[str]] = {}

    def moved(self, node: str, fabric: str | None) -> None:
        """A node already known is now on ``fabric`` (a patched room, placement.scheduler.Planner)."""
        if self._fabric_of.get(node) != fabric:
            self._fabric_of[node] = fabric  # type: ignore[index]
            self._fabrics.clear()

    def holders(self, model: str) -> frozenset[str]:
        return self._holders.get(model, frozenset())

    def fabrics(self, model: str) -> frozenset[str]:
        """The fabrics a holder of ``model``'s weights is on."""
        if model not in self._fabrics:
            self._fabrics[model] = frozenset(
                f for n in self.holders(model) if (f := self._fabric_of.get(n)) is not None
            )
        return self._fabrics[model]

    def rank(self, model: str, node: str) -> int:
        """LOCAL, FABRIC or COLD for a replica of ``model`` on ``node``."""
        if node in self.holders(model):
            return LOCAL
        fabric = self._fabric_of.get(node)
        return FABRIC if fabric is not None and fabric in self.fabrics(model) else COLD

    def replica_rank(self, model: str, nodes: Iterable[str]) -> int:
        """A multi-node replica is as warm as its coldest shard."""
        return max((self.rank(model, n) for n in nodes), default=COLD)

    def note(self, model: str, nodes: tuple[str, ...]) -> str | None:
        """Why a replica was placed without its weights, when some node holds them; None otherwise."""
        holders = sorted(self.holders(model))
        if not holders:
            return None
        cold = [n for n in nodes if self.rank(model, n) != LOCAL]
        if not cold:
            return None
        named = ", ".join(holders[:NAMED]) + (", …" if len(holders) > NAMED else "")
        where = "on " + ", ".join(cold)
        near = all(self.rank(model, n) == FABRIC for n in cold)
        how = "it fetches them at start, from its fabric" if near else "it fetches them at start"
        return (
            f"placed {where} without the model's weights on disk: the nodes that hold them ({named}) "
            f"could not take it as well; {how}"
        )
