"""The snapshot inventory: the format of `kubectl get nodes,pods,resourcequotas -A -o yaml`, YAML or JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import fleet, pod, policy, quota
from webhook.domain.model import PoolKey
from webhook.sources.snapshot import InventoryFileError, SnapshotInventory

REPO = Path(__file__).resolve().parents[2]
POLICY = policy()


def as_list(items: list[dict]) -> dict:  # type: ignore[type-arg]
    return {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}}


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_kubectl_list_loads_in_yaml_and_json(tmp_path: Path, fmt: str) -> None:
    """Both output formats of kubectl give the same pools."""
    data = as_list(
        [*fleet(), pod("a", gpus=2, node="t4-a", phase="Running"), quota("q", "team", {"requests.nvidia.com/gpu": "2"})]
    )
    path = tmp_path / f"cluster.{fmt}"
    path.write_text(yaml.safe_dump(data) if fmt == "yaml" else json.dumps(data))
    inventory = SnapshotInventory.from_file(str(path), POLICY)
    assert inventory.ready and inventory.age_seconds() == 0
    with inventory.read() as index:
        t4 = next(s for s in index.capacity.pool_stats() if s.pool == PoolKey("nvidia", "medium", "Tesla-T4"))
        assert (t4.gpus_total, t4.gpus_free) == (8, 6)
        assert [q.name for q in index.quotas.of("team")] == ["q"]


def test_demo_inventory_pools() -> None:
    """The demo cluster has every kind of pool the README shows, with its cordoned and NotReady nodes."""
    inventory = SnapshotInventory.from_file(str(REPO / "examples" / "cluster.yaml"), POLICY)
    with inventory.read() as index:
        pools = {str(s.pool): s for s in index.capacity.pool_stats()}
    assert set(pools) == {
        "nvidia/medium/Tesla-T4",
        "nvidia/medium/NVIDIA-L4",
        "nvidia/high/NVIDIA-A100-SXM4-40GB",
        "nvidia/high/NVIDIA-H100-80GB-HBM3",
        "nvidia/low/NVIDIA-GeForce-RTX-3060",
        "nvidia/low/NVIDIA-GeForce-RTX-4090",
        "amd/high/AMD_Instinct_MI250X",
        "ascend/high/huawei-Ascend910",
        "nvidia/medium/Tesla-T4-SHARED",
        "nvidia/high/NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia/high/NVIDIA-A100-SXM4-40GB-MIG-1g.5gb/nvidia.com/mig-1g.5gb",
        "nvidia/high/NVIDIA-A100-SXM4-40GB-MIG-3g.20gb/nvidia.com/mig-3g.20gb",
    }
    t4 = pools["nvidia/medium/Tesla-T4"]
    # 8 usable - 4 running - 1 held for the Pending Pod gpupool pinned; the NotReady node offers nothing
    assert (t4.nodes, t4.usable_nodes, t4.gpus_free, t4.pending) == (3, 2, 3, 1)
    a100 = pools["nvidia/high/NVIDIA-A100-SXM4-40GB"]
    # the cordoned node offers nothing; the mixed-strategy MIG node adds its 4 whole GPUs
    assert (a100.nodes, a100.usable_nodes, a100.gpus_free) == (4, 3, 13)
    assert pools["nvidia/high/NVIDIA-H100-80GB-HBM3"].gpus_free == 0
    assert pools["amd/high/AMD_Instinct_MI250X"].memory_mib == 64 * 1024


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("items: [\n", "not valid YAML: line 2, column 1"),
        ('{"items": [', "not valid JSON"),
        ("kind: List\nitems: [{kind: Service, metadata: {name: s}}]\n", "item 0 is a Service; expected only Node"),
        ("kind: Status\nmetadata: {name: x}\n", "expected a List with items"),
        ("- 1\n- 2\n", "expected Kubernetes objects"),
        ("apiVersion: v1\nfoo: bar\n", "expected a List with items"),
        ("kind: List\nitems: [{metadata: {name: x}}]\n", "item 0 is not a Kubernetes object"),
        ("kind: List\nitems: [{kind: Node, metadata: {}}]\n", "item 0 (Node) has no metadata.name"),
        ("kind: List\nitems: []\n", "no Node objects"),
        (
            "kind: List\nitems: [{kind: Node, metadata: {name: n}}, {kind: Pod, metadata: {name: p}}]\n",
            "Pod p has no metadata.namespace",
        ),
    ],
)
def test_bad_files_name_the_file_and_problem(tmp_path: Path, content: str, message: str) -> None:
    """A file that is not a cluster capture is refused with what was wrong and what is expected."""
    path = tmp_path / "cluster.yaml"
    path.write_text(content)
    with pytest.raises(InventoryFileError) as err:
        SnapshotInventory.from_file(str(path), POLICY)
    assert str(path) in str(err.value) and message in str(err.value)


def test_missing_and_binary_files(tmp_path: Path) -> None:
    """Unreadable files are errors naming the path, not tracebacks."""
    with pytest.raises(InventoryFileError, match="cannot read inventory file"):
        SnapshotInventory.from_file(str(tmp_path / "nope.yaml"), POLICY)
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InventoryFileError, match="not UTF-8"):
        SnapshotInventory.from_file(str(binary), POLICY)


def test_yaml_stream_of_objects_is_accepted(tmp_path: Path) -> None:
    """`kubectl get node x -o yaml` documents joined with --- work as well as a List."""
    path = tmp_path / "stream.yaml"
    path.write_text(yaml.safe_dump_all(fleet()))
    with SnapshotInventory.from_file(str(path), POLICY).read() as index:
        assert len(index.capacity.pool_stats()) == 5


class Recorder:
    """An observer, as the queue's waiting Pods follow the live inventory (webhook.sources.live.Observer)."""

    def __init__(self) -> None:
        self.lists: list[tuple[str, list[str], bool, bool]] = []

    def replace(self, kind: str, objects: list[Any], first: bool, final: bool) -> None:
        self.lists.append((kind, [o["metadata"]["name"] for o in objects], first, final))

    def apply(self, kind: str, event: str, obj: Any) -> None:
        raise AssertionError("a snapshot has no events")


def test_observers_get_each_kind_as_one_full_list(tmp_path: Path) -> None:
    """What the live inventory's first list gives its observers, a snapshot gives them at once: every
    object of each kind, in one list that is both the first and the last page."""
    path = tmp_path / "cluster.yaml"
    path.write_text(
        yaml.safe_dump(as_list([*fleet()[:1], pod("a", gpus=1), quota("q", "team", {"nvidia.com/gpu": "1"})]))
    )
    recorder = Recorder()
    SnapshotInventory.from_file(str(path), POLICY, [recorder])
    assert recorder.lists == [
        ("nodes", [fleet()[0]["metadata"]["name"]], True, True),
        ("pods", ["a"], True, True),
        ("resourcequotas", ["q"], True, True),
    ]
