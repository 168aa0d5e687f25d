"""One gateway replica as a process: what builds it, shows its state and ends it.

- `replica.py`: the composition root (`Gateway`): builds every part once, wires them, runs their loops;
- `livestate.py`: the gauges, the alert rules' inputs and the `/admin/state` document;
- `drain.py`: what the replica does between SIGTERM and its exit;
- `workers.py`: `omnigate serve --workers N`, N replicas on one port under one supervisor.
"""
