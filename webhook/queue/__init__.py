"""The queue: Pods that wait gated (`gpupool.io/queue`) until one leader releases them to a pool with room.

A layer of its own, between admission | sources and serving: `waiting` (the queued Pods, from the
inventory's own watch, in release order), `release` (which of them go where now, exactly), `leader` (who
may release: a Lease), `runner` (the leader's loop: decide, write, tell). Its Kubernetes writes are in
webhook.sources.writes, beside the reads.
"""
