"""Reads: one object (GET …/NAME) and lists in pages, consistent at the first page's resourceVersion.

All pages of a list come from the state at the first page's resourceVersion, whatever was written in
between (webhook.testing.kubestore rebuilds older snapshots from its history); a continue token whose
resourceVersion was compacted gives 410 Expired, a resourceVersion from the future 504.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

import orjson

from webhook.testing.kubehttp import ApiState, BaseHandler
from webhook.testing.kubeproto import CONTINUE_EXPIRED, ApiError, int_param, list_rv, not_found
from webhook.testing.kuberesources import Resource
from webhook.testing.kubeselect import Selector, selector_of
from webhook.testing.kubestore import Expired, TooLarge, decode_continue, encode_continue


def serve_get(handler: BaseHandler, state: ApiState, res: Resource, namespace: str, name: str) -> None:
    state.take_failure("get")
    body = state.store.get(res.kind, namespace, name)
    if body is None:
        raise not_found(res.qualified, name)
    handler.send_json(200, res.render(body))


def serve_list(
    handler: BaseHandler, state: ApiState, res: Resource, namespace: str | None, query: dict[str, str]
) -> None:
    selector = begin(state, "list", state.lists, res, query)
    limit = int_param(query, "limit")
    token = query.get("continue", "")
    start = ""
    try:
        if token:
            if query.get("resourceVersion", "") not in ("", "0"):
                raise ApiError(400, "specifying resource version is not allowed when using continue")
            try:
                at, start = decode_continue(token)
            except ValueError as exc:
                raise ApiError(400, str(exc)) from None
            try:
                snap = state.store.snapshot(res.kind, at)
            except Expired:
                raise ApiError(410, CONTINUE_EXPIRED) from None
        else:
            snap = state.store.snapshot(res.kind, list_rv(state.store, query, limit))
    except Expired as exc:
        raise ApiError(410, str(exc)) from None
    except TooLarge as exc:
        raise ApiError(504, str(exc)) from None
    lo, hi = snap.bounds(namespace)
    first = bisect_left(snap.keys, start, lo, hi) if start else lo
    meta: dict[str, Any] = {"resourceVersion": str(snap.rv)}
    if selector is None:
        end = hi if limit <= 0 else min(hi, first + limit)
        if end < hi:
            meta["continue"] = encode_continue(snap.rv, snap.keys[end - 1])
            meta["remainingItemCount"] = hi - end
        chosen = snap.bodies[first:end]
    else:
        chosen, last = _select(snap.bodies, first, hi, limit, selector)
        if last is not None:  # a full page: the rest may hold more (kube-apiserver gives no count)
            meta["continue"] = encode_continue(snap.rv, snap.keys[last])
    items = chosen if res.to_view is None else [res.render_item(b) for b in chosen]
    body = b"".join(
        (
            b'{"kind":"%bList","apiVersion":"%b","metadata":' % (res.kind.kind.encode(), res.api_version.encode()),
            orjson.dumps(meta),
            b',"items":[',
            b",".join(items),
            b"]}",
        )
    )
    handler.send_json(200, body)


def _select(bodies: list[bytes], first: int, hi: int, limit: int, selector: Selector) -> tuple[list[bytes], int | None]:
    """The matching bodies from `first`, up to `limit`; and the index of the last one when the page is full
    and more remain to be examined (where the next page continues)."""
    chosen: list[bytes] = []
    for i in range(first, hi):
        if selector.matches(orjson.loads(bodies[i])):
            chosen.append(bodies[i])
            if 0 < limit == len(chosen):
                return chosen, (i if i + 1 < hi else None)
    return chosen, None


def begin(state: ApiState, verb: str, counter: dict[str, int], res: Resource, query: dict[str, str]) -> Selector | None:
    """What every list and watch does first: count it, answer an injected failure, read the selectors."""
    with state.lock:
        counter[res.plural] += 1
    state.take_failure(verb)
    return selector_of(query, res.kind.kind)
