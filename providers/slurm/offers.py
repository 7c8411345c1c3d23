"""Nodes, partitions and the queue → offers: per node, per rack group, per fabric island.

Fabric, rack and intra-node link are read from node features; the GPU model from
the node's GRES type. Owned hardware is priced at its amortised cost
(``SlurmConfig.owned``), per GPU. Pure: slurmrestd's flat shapes in, offers out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

import providers.slurm.api as api
from broker.gpus import GPU_SPECS, normalise_gpu
from broker.models import Colocate, Fabric, IntraNode, Locality, Market, Network, Offer
from providers.capabilities import NodeUsage
from providers.slurm.config import SlurmConfig
from providers.slurm.queue import QueueModel

PROVIDER = "slurm"

# Feature → fabric. Features are matched case-insensitively; ib_ndr / ib_hdr / plain ib.
_IB_SPEEDS = {"ndr": 400.0, "hdr": 200.0, "edr": 100.0, "fdr": 56.0, "xdr": 800.0}
_FABRIC_GBPS = {Fabric.infiniband: 200.0, Fabric.roce: 200.0, Fabric.ethernet: 100.0, Fabric.none: 0.0}


@dataclass(frozen=True)
class NodeTraits:
    """What a node's features say about its network and place."""

    fabric: Fabric
    fabric_gbps: float
    fabric_feature: str  # the feature that named the fabric ("ib_ndr"), for constraints
    intra: IntraNode
    rack: str  # "rack1", or ""


def node_traits(features: Iterable[str]) -> NodeTraits:
    """Fabric (ib_*/ib → InfiniBand, roce, eth), intra-node link (nvlink/pcie) and rack (rackN)."""
    fabric, gbps, ffeat = Fabric.none, 0.0, ""
    intra, rack = IntraNode.pcie, ""
    rank = {Fabric.none: 0, Fabric.ethernet: 1, Fabric.roce: 2, Fabric.infiniband: 3}
    for feat in features:
        f = feat.strip().lower()
        cand: Fabric | None = None
        speed = 0.0
        if f == "ib" or f.startswith(("ib_", "ib-", "infiniband")):
            cand = Fabric.infiniband
            suffix = re.split(r"[_-]", f, maxsplit=1)[1] if re.search(r"[_-]", f) else ""
            speed = _IB_SPEEDS.get(suffix, _FABRIC_GBPS[Fabric.infiniband])
        elif f == "roce" or f.startswith(("roce_", "roce-")):
            cand, speed = Fabric.roce, _FABRIC_GBPS[Fabric.roce]
        elif f in ("eth", "ethernet") or f.startswith(("eth_", "eth-")):
            cand, speed = Fabric.ethernet, _FABRIC_GBPS[Fabric.ethernet]
        elif f == "nvlink" or f.startswith("nvlink"):
            intra = IntraNode.nvlink
        elif re.fullmatch(r"rack[-_]?\w+", f):
            rack = feat.strip()
        if cand is not None and (rank[cand], speed) > (rank[fabric], gbps):
            fabric, gbps, ffeat = cand, speed, feat.strip()
    return NodeTraits(fabric, gbps, ffeat, intra, rack)


def gpu_model(gres_type: str, features: Iterable[str] = ()) -> str | None:
    """Canonical GPU model from a GRES type (``h100``, ``nvidia_a100_80gb_pcie``) or, failing that, a feature."""
    if re.fullmatch(r"\d+g\.\d+gb", gres_type.lower()):
        return None  # a MIG slice ("1g.10gb"): a fraction of a GPU, not a model the router can price
    if gres_type:
        direct = normalise_gpu(gres_type)
        if direct:
            return direct
        tokens = [t for t in re.split(r"[_\-\s]+", gres_type.lower()) if t and t != "nvidia"]
        mem = next((float(m.group(1)) for t in tokens if (m := re.fullmatch(r"(\d+)gb?", t))), None)
        form = next((t for t in tokens if t in ("pcie", "sxm", "sxm4", "sxm5", "nvl")), "")
        if tokens:
            family = tokens[0]
            for name in (f"{family}{form}{int(mem)}gb" if mem else "", f"{family}{form}", family):
                if name and (model := normalise_gpu(name, mem)):
                    return model
    for feat in features:
        model = normalise_gpu(feat)
        if model:
            return model
    return None


def node_usage(node: api.NodeInfo) -> NodeUsage:
    """A node as the core sees a pool's node: its GPU model, GPU use and health."""
    return NodeUsage(
        name=node.name,
        gpu=gpu_model(node.gpu_type, node.features),
        gpus_total=node.gpus_total,
        gpus_used=node.gpus_used,
        healthy=node.healthy,
        state="+".join(sorted(node.state)),
    )


class OfferBuilder:
    """Turns nodes, partitions and the queue into offers: per node, per rack group, per fabric island."""

    def __init__(
        self,
        config: SlurmConfig,
        partitions: list[api.PartitionInfo],
        nodes: list[api.NodeInfo],
        jobs: list[api.JobInfo],
        now: float,
    ) -> None:
        self.config = config
        self.partitions = partitions
        self.nodes = nodes
        self.jobs = jobs
        self.now = now
        self.node_rate = config.owned.usd_per_node_hour()
        self.queue_model = QueueModel(nodes, jobs, now)  # shared by every offer's wait estimate

    def _partition_for(self, members: list[api.NodeInfo]) -> str | None:
        """A partition holding all these nodes: the configured one, else the default, else the first.

        The nodes' own partition lists win over the partitions' host lists (both are answers of the
        same daemon, but a node's list is what the scheduler uses for it).
        """
        want = {n.name for n in members}
        up = {p.name: p for p in self.partitions if "UP" in p.state or not p.state}
        known = {p.name for p in self.partitions}
        if all(n.partitions for n in members):
            common = [p for p in members[0].partitions if all(p in n.partitions for n in members[1:])]
            names = [p for p in common if p in up or p not in known]  # hidden partitions are not listed
        else:
            names = [p.name for p in up.values() if want <= set(p.nodes)]
        if not names:
            return None
        if self.config.partition:
            # The operator limited Lockstep to one partition.
            return self.config.partition if self.config.partition in names else None
        return next((n for n in names if n in up and up[n].default), names[0])

    def _wait(self, gpus: int, k: int, names: Iterable[str], gres_type: str) -> float:
        wait = self.queue_model.wait_hours(gpus, k, None, gres_type or None, candidates=set(names))
        return wait if math.isfinite(wait) else api.UNLIMITED_JOB_HOURS * 7

    def _offer(
        self,
        *,
        offer_id: str,
        members: list[api.NodeInfo],
        model: str,
        traits: NodeTraits,
        gpu_count: int,
        max_nodes: int,
        colocation: Colocate,
        partition: str,
        host: str = "",
        rack: str = "",
    ) -> Offer:
        first = members[0]
        configured = min(n.gpus_total for n in members)
        island = f"{self.config.cluster_name}-{traits.fabric_feature}" if traits.fabric_feature else ""
        common = set(first.features).intersection(*(set(n.features) for n in members[1:]))
        return Offer(
            id=offer_id,
            provider=PROVIDER,
            market=Market.owned,
            sku=f"{first.gpu_type or model}x{configured}",
            gpu=model,
            gpu_count=gpu_count,
            gpu_memory_gb=GPU_SPECS[model].memory_gb,
            vcpus=min(n.cpus for n in members),
            ram_gb=round(min(n.memory_mb for n in members) / 1024.0, 1),
            # Owned hardware costs its amortised node-hour whether used or not; a job pays its share of GPUs.
            usd_per_hour=round(self.node_rate * gpu_count / configured, 6),
            divisible=True,
            interruptible=False,
            max_nodes=max_nodes,
            colocation=colocation,
            locality=Locality(
                provider=PROVIDER,
                region=self.config.cluster_name,
                zone=partition,
                cluster=island,
                rack=rack,
                host=host,
            ),
            network=Network(intra=traits.intra, fabric=traits.fabric, fabric_gbps=traits.fabric_gbps),
            queue_wait_hours=self._wait(gpu_count, max_nodes, (n.name for n in members), first.gpu_type),
            attrs={
                "partition": partition,
                "nodes": ",".join(n.name for n in members),
                "features": ",".join(f for f in first.features if f in common),
                "gres_type": first.gpu_type,
                "configured_gpus": str(configured),
                "free_gpus": str(min(n.gpus_free for n in members)),
                "fabric_feature": traits.fabric_feature,
                "rack_feature": rack,
                "containers": self.config.container_runtime,  # "none": an image cannot run here
            },
        )

    def build(self) -> list[Offer]:
        cluster = self.config.cluster_name
        out: list[Offer] = []
        usable: list[tuple[api.NodeInfo, str, NodeTraits]] = []
        for node in self.nodes:
            if not node.healthy or node.gpus_total <= 0:
                continue
            model = gpu_model(node.gpu_type, node.features)
            if model is None:
                continue  # MIG slices and unknown models: nothing the router can price
            partition = self._partition_for([node])
            if partition is None:
                continue
            traits = node_traits(node.features)
            usable.append((node, model, traits))
            # A busy node is still offered, at its full size, with the wait until it frees up.
            count = node.gpus_free or node.gpus_total
            out.append(
                self._offer(
                    offer_id=f"{PROVIDER}/{cluster}/{node.name}",
                    members=[node],
                    model=model,
                    traits=traits,
                    gpu_count=count,
                    max_nodes=1,
                    colocation=Colocate.node,
                    partition=partition,
                    host=node.name,
                    rack=traits.rack,
                )
            )

        # Multi-node offers: nodes sharing GPU model and fabric, per rack and per fabric island.
        groups: dict[tuple[str, str, str], list[api.NodeInfo]] = {}
        for node, model, traits in usable:
            if traits.fabric is Fabric.none or node.gpus_free <= 0:
                continue
            key = (model, traits.fabric_feature, "")
            groups.setdefault(key, []).append(node)
            if traits.rack:
                groups.setdefault((model, traits.fabric_feature, traits.rack), []).append(node)
        seen: set[tuple[str, str, int, int]] = set()
        # Racks first: a rack offer dominates the island offer of the same size and shape.
        for (model, ffeat, rack), members in sorted(groups.items(), key=lambda kv: kv[0][2] == ""):
            members = sorted(members, key=lambda n: (-n.gpus_free, n.name))
            traits = node_traits(members[0].features)
            for k in range(2, len(members) + 1):
                g = members[k - 1].gpus_free
                if k < len(members) and members[k].gpus_free == g:
                    continue  # k+1 nodes of the same size dominate k
                if (model, ffeat, k, g) in seen:
                    continue
                chosen = members[:k]
                partition = self._partition_for(chosen)
                if partition is None:
                    continue
                seen.add((model, ffeat, k, g))
                level = "rack" if rack else "island"
                out.append(
                    self._offer(
                        offer_id=f"{PROVIDER}/{cluster}/{level}/{rack or ffeat}/{model}/{k}x{g}",
                        members=chosen,
                        model=model,
                        traits=traits,
                        gpu_count=g,
                        max_nodes=k,
                        colocation=Colocate.rack if rack else Colocate.cluster,
                        partition=partition,
                        rack=rack,
                    )
                )
        return out
