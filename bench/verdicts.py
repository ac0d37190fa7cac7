"""Every verdict for a fixed corpus of Pods, one line each, to diff between two trees: the check that a
refactor changed nothing a user sees (outcome, status code, message, reason code, warnings, the explain
lines, the patch's bytes, the pool, the resource a queued Pod waits for).

The corpus is this checkout's: the Pods of `examples/pods/` and of bench_decision.py, in five
namespaces, under the demo policy and under it with team-a queueing (`placement: queue`), decided
against the demo snapshot (`examples/cluster.yaml`), and under the default policy against the 50-node
synthetic fleet. `--tree` decides
them with another checkout's `webhook` package (an older commit, `git worktree add ../before <commit>`):

    .venv/bin/python bench/verdicts.py --tree ../before > before.txt
    .venv/bin/python bench/verdicts.py > after.txt && diff before.txt after.txt && echo same
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent.parent
NAMESPACES = ("team-a", "team-b", "students", "ml", "default")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=HERE, help="the checkout whose webhook package decides")
    args = parser.parse_args()
    sys.path.insert(0, str(args.tree.resolve()))
    # Imported once the tree is on the path: its package decides.
    import webhook
    from webhook.admission.core import evaluate
    from webhook.domain.policy_build import load_policy_text
    from webhook.sources.open import open_inventory

    assert Path(webhook.__file__).resolve().is_relative_to(args.tree.resolve()), webhook.__file__
    spec = importlib.util.spec_from_file_location("bench_decision", HERE / "bench" / "bench_decision.py")
    assert spec is not None and spec.loader is not None
    decision = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(decision)
    pods: list[dict[str, Any]] = []
    for f in sorted((HERE / "examples" / "pods").glob("*.yaml")):
        pods.extend(d for d in yaml.safe_load_all(f.read_text()) if d)
    pods.extend(decision.PODS)
    demo = (HERE / "examples" / "policy.yaml").read_text()
    fleet, _, _ = decision.build(50, 1500, 0.0)
    assert sys.modules[type(fleet).__module__].__file__.startswith(str(args.tree.resolve()))

    def line(*where: object, v: Any) -> str:
        pool = str(v.placement.pool) if v.placement is not None else ""
        seen = [v.allowed, v.outcome, v.code, v.message, v.reason, list(v.warnings), list(v.reasons)]
        return json.dumps([*where, *seen, json.dumps(list(v.patch)), pool, v.queued])

    def each(name: str, policy: Any, index: Any) -> None:
        for ns in NAMESPACES:
            for i, raw in enumerate(pods):
                pod = copy.deepcopy(raw)
                pod.setdefault("metadata", {})["namespace"] = ns
                print(line(name, ns, i, v=evaluate(pod, ns, policy, index, explain=True)))

    queued = demo.replace("  team-a:\n", "  team-a:\n    placement: queue\n", 1)
    for name, text in (("demo", demo), ("demo, team-a queued", queued)):
        policy = load_policy_text(text)
        inventory = open_inventory(policy, snapshot=str(HERE / "examples" / "cluster.yaml"), start=False)
        with inventory.read() as index:
            each(name, policy, index)
    each("fleet", fleet.policy, fleet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
