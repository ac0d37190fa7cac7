"""The two `gpupool serve` replicas as the manifests ship them, and which of them leads (the Lease's holder)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.queuebench.cluster import LEASE_NAMESPACE, POLICY, now
from bench.soakbench.metrics import scrape
from bench.soakbench.procfs import children
from bench.soakbench.servers import Server, servers
from bench.soakbench.sim import Simulator


class Replica(Server):
    """A replica's master process, with its admission worker and its leader process (which leads or follows)."""

    def leader_process(self) -> int:
        """The pid of the replica's leader process, as its /readyz names it (0 when none runs)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=10) as answer:
                body = answer.read()
        except urllib.error.HTTPError as exc:  # 503: its body says the same
            body = exc.read()
        except OSError:
            return 0
        leader = json.loads(body or b"{}").get("leader") or {}
        return int(leader.get("pid") or 0) if leader.get("running") else 0

    def worker(self) -> int:
        """The admission worker: the master's child that is not the leader process."""
        leader = self.leader_process()
        kids = [pid for pid in children(self.proc.pid) if pid != leader]
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
    """{"leader": the replica whose leader process holds the Lease, "follower": the other}."""
    found = leader_of(replicas, holder)
    if found is None:
        raise RuntimeError(f"no replica's leader process is the Lease's holder {holder!r}")
    return {"leader": found[0], "follower": next(rep for rep in replicas if rep is not found[0])}


def leader_of(replicas: list[Replica], holder: str) -> tuple[Replica, int] | None:
    """The replica the Lease's holderIdentity (`POD_NAME`) names, and the pid of its leader process."""
    for replica in replicas:
        if replica.name == holder:
            pid = replica.leader_process()
            return (replica, pid) if pid else None
    return None
