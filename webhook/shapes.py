"""Pod shapes: the few fields of a Pod that the core reads, as a key to remember its work by.

The replicas of a Deployment, the Pods of a Job or a burst from one pipeline arrive as Pods that differ
in name, uid and many fields gpupool never reads, and agree on everything it does read: its
`gpupool.io/` annotations, the containers' names and resources, the nodeSelector and tolerations, and
the namespace. What the core derives from those alone (the validated request, and the patch for a given
placement) is remembered per shape, so the second Pod of a shape skips that work.

The key is exact, not a digest: the JSON of those fields, so two Pods share a key only when every field
the core reads is equal. A Pod whose fields cannot be keyed that way (odd types, non-string keys from
YAML) gets no key and is simply computed every time.
"""

from __future__ import annotations

from typing import Any

import orjson

from webhook.annotations import PREFIX


def shape_key(pod: Any, namespace: str) -> bytes | None:
    """The Pod's shape as a key, or None when it cannot be keyed exactly."""
    if not isinstance(pod, dict):
        return None
    meta, spec = pod.get("metadata"), pod.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return None
    annotations = meta.get("annotations")
    if annotations is not None and not isinstance(annotations, dict):
        return None
    containers = spec.get("containers")
    inits = spec.get("initContainers")
    selector = spec.get("nodeSelector")
    tolerations = spec.get("tolerations")
    if (
        not isinstance(containers, list)
        or not (inits is None or isinstance(inits, list))
        or not (selector is None or isinstance(selector, dict))
        or not (tolerations is None or isinstance(tolerations, list))
    ):
        return None
    ours = None  # no map at all (the patch then adds a whole one) is not the same as a map with none of ours
    if annotations is not None:
        # Others' annotations (kubectl's last-applied configuration, say) never change the answer.
        ours = {k: v for k, v in annotations.items() if isinstance(k, str) and k.startswith(PREFIX)}
    fields = (
        namespace,
        ours,
        selector,
        tolerations,
        [_container(c) for c in containers],
        [_container(c) for c in inits] if inits is not None else None,
    )
    try:
        return orjson.dumps(fields)
    except orjson.JSONEncodeError:  # a value JSON cannot hold exactly (a non-string key, a huge integer)
        return None


def _container(c: Any) -> Any:
    if not isinstance(c, dict):
        return False  # never equal to a container's fields, which are a list
    return [c.get("name"), c.get("resources"), c.get("restartPolicy")]
