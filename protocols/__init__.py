"""Wire formats: one module per API, each exposing `FORMAT`, a `protocols.contract.WireFormat`.

A protocol module decodes request bodies into engine requests and renders engine events as
that format's JSON body or its SSE events (`contract.SseEvent`), which `server.writer` frames and
sends. It never touches sockets or MLX.
"""
