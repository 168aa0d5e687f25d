"""What is read once at start: the base every settings schema derives from, and the deployment config.

- `schema.py`: `Frozen` (unknown keys are errors, a validated object never changes), `FrozenDict`,
  `describe` (one way to tell a validation error);
- `config.py`: the deployment config (config/gateway.yaml, `OMNIGATE_*` overrides): what needs a restart.
"""
