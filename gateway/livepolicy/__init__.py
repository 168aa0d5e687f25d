"""The runtime policy: what ops tune live (policies/*.yaml).

- `policy.py`: the schema, loading, validation and diff;
- `reloader.py`: hot reload (file change, SIGHUP, admin API) as one swapped reference;
- `refs.py`: the pools and models the policy names, checked against the config it runs with.
"""
