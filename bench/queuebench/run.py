"""The whole run: the simulator, the fleet filled, the replicas, the steady phase, then the others (phases.py);
the result is report.py's."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.queueaudit import GPU, Auditor
from bench.queuebench.backlog import make_backlog
from bench.queuebench.cluster import BACKLOG, NAMESPACES, RULES, filler, now, resource_quota
from bench.queuebench.creator import Creator, keep_topped_up, targets, wait_queued
from bench.queuebench.meters import Profile, meter
from bench.queuebench.phases import Run, burst, failover, memory, wait_for_leader
from bench.queuebench.probes import Probes, write_capacity
from bench.queuebench.replicas import replicas, roles_of
from bench.queuebench.report import report
from bench.queuebench.sim import AUDIT_LOG, Tail, list_all, post_all, quiet, simulator
from bench.soakbench.client import tls_context
from bench.soakbench.servers import read_log
from bench.soakbench.sim import SimApi, Simulator
from webhook.serving.certs import ensure_certificates
from webhook.testing.kubefit import pod_requests
from webhook.testing.synthetic import GPU_MODELS


def run(args: argparse.Namespace) -> dict[str, Any]:
    r = Run(args)
    r.notes["loadavg_start"] = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="gpupool-queue-") as tmp_name:
        tmp = Path(tmp_name)
        ensure_certificates(tmp, "gpupool-webhook", "gpupool-system", hosts=["127.0.0.1"])
        context = tls_context(tmp / "ca.crt")
        r.ca = tmp / "ca.crt"
        with simulator(args, tmp) as sim:
            api = sim.api()
            began = now()
            quiet(api)
            nodes, _ = list_all(api, "/api/v1/nodes")
            pods, listed_at = list_all(api, "/api/v1/pods", keep=lambda p: pod_requests(p.get("spec") or {}).get(GPU))
            class_of = {m.product: m.gpu_class for m in GPU_MODELS}
            auditor = Auditor(nodes, pods, RULES, [space.name for space in [*NAMESPACES, BACKLOG]], class_of)
            del pods
            tail = Tail(tmp / AUDIT_LOG, auditor, listed_at)
            print(f"listed {len(nodes):,} nodes and the Pods at {listed_at} in {now() - began:.1f} s", flush=True)
            try:
                result = phases(r, sim, api, auditor, tail=tail, nodes=nodes, tmp=tmp, context=context)
            finally:
                api.close()
        tail.stop()
    result["simulator"] = [line for line in sim.exit_lines if line.startswith("kubesim: ")]
    return result


def fill(sim: Simulator, api: SimApi, auditor: Auditor, tail: Tail) -> int:
    """Take every free GPU of every usable node with one-GPU Pods bound there; the fleet is then full."""
    for rule in RULES:
        if rule.kind == "gpus":
            api.call(
                "POST",
                f"/api/v1/namespaces/{rule.namespace}/resourcequotas",
                resource_quota(rule.namespace, rule.key, rule.hard),
            )
    fillers: list[dict[str, Any]] = []
    for name, node in auditor.nodes.items():
        if node.usable and node.gpus:
            fillers.extend(filler(name, k) for k in range(max(node.gpus - node.used, 0)))
    began = now()
    post_all(sim, fillers)
    tail.wait_for(quiet(api))
    free = sum(auditor.free.values())
    print(f"fleet saturated: {len(fillers):,} one-GPU Pods bound in {now() - began:.1f} s; free GPUs left {free}")
    if free:
        raise RuntimeError(f"{free} GPUs still free after the fill: {dict(auditor.free)}")
    return len(fillers)


def phases(  # noqa: PLR0913 (the benchmark's phases share one run's parts)
    r: Run,
    sim: Simulator,
    api: SimApi,
    auditor: Auditor,
    *,
    tail: Tail,
    nodes: list[dict[str, Any]],
    tmp: Path,
    context: Any,
) -> dict[str, Any]:
    args = r.args
    r.notes["fillers"] = fill(sim, api, auditor, tail)
    with replicas(tmp, sim) as reps:
        deadline = now() + 120
        while not auditor.snapshot()["holder"] and now() < deadline:
            time.sleep(0.2)
        r.notes["first_leader"] = auditor.snapshot()["holder"]
        creator = Creator(reps, context, sim, args.seed)
        try:
            if args.backlog:
                began = now()
                r.notes["backlog"] = made = make_backlog(creator, sim, auditor, reps, args.backlog)
                r.notes["backlog_queued_s"] = now() - began
                print(
                    f"backlog: {args.backlog:,} Pods queued past their quota in {now() - began:.1f} s", made["seconds"]
                )
            steady_targets = targets(args.queued, NAMESPACES)
            began = now()
            wait_queued(auditor, steady_targets, 600, creator)
            print(f"{args.queued:,} Pods queued in {now() - began:.1f} s; the leader is {r.notes['first_leader']}")
            holder, _, pid = wait_for_leader(reps, auditor)
            probes = Probes(sim, r.ca, roles_of(reps, holder))
            spy = Profile(args, pid, "steady", args.seconds - 5)
            cpu = meter(sim, reps)
            sim.command(f"finish-rate {args.finish_rate:g}")
            r.marks["steady"] = now()
            keep_topped_up(creator, auditor, steady_targets, now() + args.seconds)
            r.marks["steady_end"] = now()
            r.load["steady"] = cpu.read()
            r.notes["probes_steady"] = probes.stop()
            r.notes["profile_steady"] = spy.summary()
            print(f"steady: {args.seconds:g} s of {args.finish_rate:g} finishes/s", flush=True)
            cpu = meter(sim, [])  # the killed worker's pid goes: the replicas are left out
            failover(r, reps, auditor, creator, steady_targets)
            r.load["failover"] = cpu.read()
            sim.command("finish-rate 0")
            burst(r, sim, auditor, creator=creator, nodes=nodes, reps=reps)
            r.notes["write_capacity"] = write_capacity(sim)
            if args.memory_queued:
                memory(r, sim, reps, auditor, creator=creator)
        except BaseException:  # the replicas' logs go with their directory: what they warned of, first
            print(json.dumps({rep.name: log_summary(rep.log) for rep in reps}, indent=1), file=sys.stderr)
            raise
        finally:
            creator.close()
        r.notes["created_by_replica"] = dict(creator.by_replica)
        r.notes["creation_failures"] = dict(creator.failures)
        r.notes["logs"] = {rep.name: log_summary(rep.log) for rep in reps}
    r.notes["loadavg_end"] = os.getloadavg()
    return report(r, auditor)


def log_summary(log: Path) -> dict[str, Any]:
    """Lines per level of a replica's log, and its first 20 warnings and errors."""
    return read_log(log, 20, notable=lambda _, level: level in ("warning", "error", "critical"), width=300)
