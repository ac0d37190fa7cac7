"""The simulator's HTTP API: routing of every request to discovery, reads, watches and writes.

Speaks the part of kube-apiserver's REST API (JSON only) that gpupool's clients use: discovery; get, list
and watch of every served resource (webhook.testing.kuberesources); create (POST), update (PUT), patch
(PATCH, in the three patch types) and delete (DELETE) with kube-apiserver's rules
(webhook.testing.kubewrite); a SelfSubjectReview (who the caller is). Injected faults apply to every
verb. The plumbing is in webhook.testing.kubehttp, reads in kubereads, watch streams in kubewatch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import orjson

from webhook.testing.kubehttp import ApiState, BaseHandler, Server, shutdown_quietly
from webhook.testing.kubeproto import ApiError, api_versions_doc, version_doc
from webhook.testing.kubereads import serve_get, serve_list
from webhook.testing.kuberesources import Target, group_doc, group_list_doc, parse_path, resource_list_doc
from webhook.testing.kubewatch import serve_watch

__all__ = ["ApiState", "Handler", "Server", "new_server", "shutdown_quietly"]

_SELF_SUBJECT_REVIEW = ["apis", "authentication.k8s.io", "v1", "selfsubjectreviews"]
_NOT_FOUND = "the server could not find the requested resource"


class Handler(BaseHandler):
    def do_GET(self) -> None:
        self._handle(self._read)

    def do_POST(self) -> None:
        self._handle(self._write)

    def do_PUT(self) -> None:
        self._handle(self._write)

    def do_PATCH(self) -> None:
        self._handle(self._write)

    def do_DELETE(self) -> None:
        self._handle(self._write)

    def _other_method(self) -> None:
        self.close_connection = True  # the request body is left unread
        self.send_status(405, f"kubesim serves only GET, POST, PUT, PATCH and DELETE, not {self.command}")

    do_HEAD = do_OPTIONS = _other_method

    def _handle(self, route: Callable[[ApiState], None]) -> None:
        state = self.server.state
        state.wait_out_stall()
        if state.down or state.closing:
            self.close_connection = True  # an unreachable API gives no answer at all
            return
        try:
            route(state)
        except ApiError as err:
            self.send_error_status(err)
        except (RecursionError, TypeError) as exc:
            # A body nested deeper than Python recurses, or than orjson encodes (it decodes 1,024 levels
            # but encodes 254, raising TypeError when storing): refused, as Go's decoder refuses what it
            # cannot hold, rather than an error inside the simulator.
            if isinstance(exc, TypeError) and "Recursion limit" not in str(exc):
                raise
            self.send_status(400, "the request body is nested too deeply")

    # -- reads ----------------------------------------------------------------------------------

    def _read(self, state: ApiState) -> None:
        query, parts = self.parse_request_line(state)
        target = parse_path(parts)
        if target is None:
            doc = _discovery(parts, state)
            if doc is None:
                static = state.objects.get(urlsplit(self.path).path)  # webhook.testing.kubeobjects
                if static is None:
                    raise ApiError(404, _NOT_FOUND)
                state.take_failure("get")
                self.send_json(200, static)
                return
            state.take_failure("discovery")
            self.send_json(200, doc)
        elif target.name is not None:
            serve_get(self, state, target.resource, target.namespace or "", target.name)
        elif query.get("watch") in ("1", "true"):
            serve_watch(self, state, target.resource, target.namespace, query)
        else:
            serve_list(self, state, target.resource, target.namespace, query)

    # -- writes ---------------------------------------------------------------------------------

    def _write(self, state: ApiState) -> None:
        """POST creates in a collection; PUT, PATCH and DELETE act on one named object."""
        body = self.read_body()
        query, parts = self.parse_request_line(state)
        if parts == _SELF_SUBJECT_REVIEW and self.command == "POST":
            self._who_am_i(state)
            return
        target = parse_path(parts)
        if target is None or (target.resource.kind.namespaced and target.namespace is None):
            raise ApiError(404, _NOT_FOUND)
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[self.command]
        if (target.name is None) != (verb == "create"):
            raise ApiError(405, f"the server does not allow this method on the requested resource: {self.command}")
        with state.lock:
            state.writes[f"{verb} {target.resource.plural}"] += 1
        token = self.bearer()
        # A write held back (KubeSim.hold_writes) arrives only now.
        held = state.wait_out_hold(token, target.resource.plural)
        try:
            state.take_failure(verb)
            code, answer = self._apply(state, verb, target, body, query)
        finally:
            if held:
                with state.lock:
                    state.released[token] += 1
                    state.lock.notify_all()
        self.send_json(code, answer)

    def _who_am_i(self, state: ApiState) -> None:
        """A SelfSubjectReview: who the request's credentials authenticate as (`kubectl auth whoami`)."""
        user = self.caller(state)
        assert user is not None  # parse_request_line answered 401 otherwise
        review = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "SelfSubjectReview",
            "metadata": {"creationTimestamp": None},
            "status": {"userInfo": {"username": user.username, "groups": list(user.groups)}},
        }
        self.send_json(201, orjson.dumps(review))

    def _apply(
        self, state: ApiState, verb: str, target: Target, body: bytes, query: dict[str, str]
    ) -> tuple[int, bytes]:
        writer = state.writer
        user = self.caller(state)
        if verb == "create":
            return writer.create(target, body, query)
        if verb == "update":
            return writer.update(target, body, query, user=user)
        if verb == "patch":
            return writer.patch(target, body, self.headers.get("Content-Type") or "", query, user=user)
        return writer.delete(target, body, query)


def _discovery(parts: list[str], state: ApiState) -> bytes | None:
    docs: dict[tuple[str, ...], Callable[[], dict[str, Any]]] = {
        ("version",): version_doc,
        ("api",): lambda: api_versions_doc(state.port),
        ("apis",): group_list_doc,
    }
    maker = docs.get(tuple(parts))
    if maker is not None:
        return orjson.dumps(maker())
    if parts[:1] == ["api"] and len(parts) == 2:
        doc = resource_list_doc("", parts[1])
    elif parts[:1] == ["apis"] and len(parts) == 2:
        doc = group_doc(parts[1])
    elif parts[:1] == ["apis"] and len(parts) == 3:
        doc = resource_list_doc(parts[1], parts[2])
    else:
        return None
    return None if doc is None else orjson.dumps(doc)


def new_server(address: tuple[str, int], state: ApiState) -> Server:
    return Server(address, state, Handler)
