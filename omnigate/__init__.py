"""The `omnigate` command and the demo: the one place that names both the product and its harness.

`gateway` (the product) and `loadtest` (the harness and simulated engine) never import each other's
command lines; this package sits above both and dispatches (`omnigate.cli`) and composes them for the demo
(`omnigate.demo`).
"""
