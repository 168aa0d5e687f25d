"""The way to the backends: one HTTP/1.1 client, a request opened and relayed under deadlines, SSE read.

- `upstream.py`: the keep-alive client (asyncio protocols, httptools' parser);
- `proxy.py`: open a request on one backend (retry-safe or not), relay its bytes under one watchdog, and
  the typed upstream errors;
- `sse.py`: the streaming relay's inspection: events passed byte-exact, first token, audio, usage learned.
"""
