"""The two `gpupool serve` replicas as the manifests ship them, and which of them leads (the Lease's holder)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.queuebench.cluster import LEASE_NAMESPACE, POLICY, now
from bench.soakbench.metrics import scrape
from bench.soakbench.procfs import children
from bench.soakbench.servers import Server, servers
from bench.soakbench.sim import Simulator


class Replica(Server):
    """A replica's master process; its worker is the process that leads or follows."""

    def worker(self) -> int:
        kids = children(self.proc.pid)
        return kids[0] if kids else 0

    def queued(self) -> float:
        """Pods this replica's worker counts as waiting (gpupool_queue_pods summed over namespaces)."""
        text = scrape(self.health_port)
        return sum(float(m) for m in re.findall(r'^gpupool_queue_pods\{namespace="[^"]+"\} ([\d.e+]+)$', text, re.M))


@contextmanager
def replicas(tmp: Path, sim: Simulator) -> Iterator[list[Replica]]:
    """replica-a and replica-b, started together, each waited for until its first full list."""
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY, "utf-8")
    names = ["replica-a", "replica-b"]
    env = {name: {"POD_NAME": name, "POD_NAMESPACE": LEASE_NAMESPACE} for name in names}
    began = now()
    with servers(
        Replica,
        names,
        tmp,
        sim,
        options=["--policy", str(policy)],
        env=env,
        ready_timeout=600,
        announce=False,
    ) as started:
        print(f"replicas ready (live inventory synced) in {now() - began:.1f} s", flush=True)
        yield started


def roles_of(replicas: list[Replica], holder: str) -> dict[str, Replica]:
    """{"leader": the replica whose worker holds the Lease, "follower": the other}."""
    found = leader_of(replicas, holder)
    if found is None:
        raise RuntimeError(f"no replica's worker is the Lease's holder {holder!r}")
    return {"leader": found[0], "follower": next(rep for rep in replicas if rep is not found[0])}


def leader_of(replicas: list[Replica], holder: str) -> tuple[Replica, int] | None:
    """The replica and worker pid the Lease's holderIdentity (`POD_NAME-pid`) names."""
    name, _, pid = holder.rpartition("-")
    for replica in replicas:
        if replica.name == name and pid.isdigit() and int(pid) in children(replica.proc.pid):
            return replica, int(pid)
    return None
