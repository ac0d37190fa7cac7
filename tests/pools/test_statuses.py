"""The GPUPool statuses (webhook/pools/statuses.py): each pool's figures as `kubectl get gpupools` shows
them, under a name kube-apiserver accepts, stable from the pool's key and never shared by two pools."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from tests.builders import gpu_node, index_of, pod
from webhook.domain.model import PoolKey
from webhook.pools.statuses import NAME_MAX, object_names, pool_statuses

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
L4 = PoolKey("nvidia", "medium", "NVIDIA-L4")
T4 = PoolKey("nvidia", "medium", "Tesla-T4")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

keys = st.builds(
    PoolKey,
    st.text("abcdefgXYZ-_.", min_size=1, max_size=12),
    st.text("abcXYZ09-", min_size=1, max_size=12),
    st.text("abcdefghXYZ0123456789-._", min_size=1, max_size=90),
    st.sampled_from(["", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"]),
)


class TestObjectNames:
    def test_a_pool_is_named_after_its_key(self) -> None:
        """Lowercased, each run of other characters one `-`: readable in `kubectl get gpupools`."""
        mig = PoolKey("nvidia", "high", "A100-MIG-1g.5gb", "nvidia.com/mig-1g.5gb")
        assert object_names([L4, mig]) == {
            L4: "nvidia-medium-nvidia-l4",
            mig: "nvidia-high-a100-mig-1g-5gb-nvidia-com-mig-1g-5gb",
        }

    def test_a_long_key_is_cut_and_ends_in_its_hash(self) -> None:
        """A name longer than 63 characters is cut and ends in 8 hex digits of the key's hash: two keys
        that agree in their first 54 characters still get two names."""
        one = PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb-with-a-very-long-suffix", "nvidia.com/a")
        two = PoolKey(one.vendor, one.gpu_class, one.product, "nvidia.com/b")
        names = object_names([one, two])
        assert len(set(names.values())) == 2
        for name in names.values():
            assert len(name) <= NAME_MAX
            assert re.fullmatch(r"nvidia-high-nvidia-a100-.*-[0-9a-f]{8}", name), name

    def test_keys_that_would_share_a_name_get_their_hashes(self) -> None:
        """`Tesla-T4` and `tesla.t4` would both be `tesla-t4`: each gets its own hash instead."""
        other = PoolKey("nvidia", "medium", "tesla.t4")
        names = object_names([T4, other])
        assert names[T4] != names[other]
        assert all(re.fullmatch(r"nvidia-medium-tesla-t4-[0-9a-f]{8}", n) for n in names.values())

    @given(st.lists(keys, min_size=1, max_size=8, unique=True))
    def test_names_are_dns_labels_unique_and_stable(self, pools: list[PoolKey]) -> None:
        """Whatever the keys: every name is a DNS-1123 label, no two pools share one, and a pool's name
        does not depend on the order of the others."""
        names = object_names(pools)
        assert len(set(names.values())) == len(pools)
        for name in names.values():
            assert len(name) <= NAME_MAX and DNS_LABEL.fullmatch(name), name
        assert object_names(reversed(pools)) == names


class TestPoolStatuses:
    def test_each_figure_of_a_pool(self) -> None:
        """Two T4 nodes of 4 GPUs, 3 held on one and 1 on the other: capacity 8, allocated 4, free 4,
        the most free on one node 3; the Pods queued for it as counted by the queue."""
        index = index_of(
            [
                gpu_node("t4-a", "Tesla-T4", 4),
                gpu_node("t4-b", "Tesla-T4", 4),
                pod("a", gpus=3, node="t4-a", phase="Running", tolerations=[GPU_TOLERATION]),
                pod("b", gpus=1, node="t4-b", phase="Running", tolerations=[GPU_TOLERATION]),
            ]
        )
        statuses = pool_statuses(index.capacity.pool_stats(), {T4: 2, L4: 5})
        assert statuses == {
            "nvidia-medium-tesla-t4": {
                "pool": "nvidia/medium/Tesla-T4",
                "vendor": "nvidia",
                "class": "medium",
                "product": "Tesla-T4",
                "deviceKind": "gpu",
                "resource": "nvidia.com/gpu",
                "nodes": 2,
                "usableNodes": 2,
                "capacity": 8,
                "allocated": 4,
                "free": 4,
                "largestFree": 3,
                "queued": 2,
            }
        }

    def test_a_node_not_usable_counts_as_a_node_only(self) -> None:
        """A cordoned node is one of the pool's nodes, but none of its GPUs is capacity or free."""
        index = index_of([gpu_node("t4-a", "Tesla-T4", 4), gpu_node("t4-b", "Tesla-T4", 2, unschedulable=True)])
        (status,) = pool_statuses(index.capacity.pool_stats(), {}).values()
        assert (status["nodes"], status["usableNodes"], status["capacity"], status["free"]) == (2, 1, 4, 4)
        assert (status["largestFree"], status["queued"]) == (4, 0)
