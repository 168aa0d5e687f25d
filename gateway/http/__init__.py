"""The HTTP side of the gateway: what a client's connection meets.

- `server.py`: uvicorn as `omnigate serve` runs it, with a graceful drain between SIGTERM and the exit;
- `edge.py`: the limits uvicorn lacks (header size and read time, connection count), before any parsing;
- `app.py`: the Starlette app, its routes and the lifespan that runs one replica; `asgi.py`: request ids,
  the access log and safe response sending; `model_list.py`: `/v1/models`;
- `pipeline.py`: the completion endpoint, the request's way as one straight line; `stream_end.py`: ending a
  stream the gateway no longer relays, so the engine says what it cost.
"""
