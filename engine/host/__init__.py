"""The host room: how an engine is put together and run for the server.

Owns the client interface the server uses (client.EngineClient), building an engine from
settings (build, assemble), the two hosts (thread; child process with its messages and frames),
warm-up, and shard/ (one model over several ranks).

May import every other engine room. Nothing in engine imports it except the server-facing
entry points; server/ and protocols/ import engine.host.client, engine.host.build and
engine.host.settings.
"""
