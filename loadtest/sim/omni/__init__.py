"""The SGLang-Omni simulator: sglang-omni's HTTP surface over a staged Qwen3-Omni pipeline model.

`omnigate sim --api sglang-omni` serves it; `create_app(OmniConfig(...))` in `server.py` builds one
in process. It shares the continuous-batching engine (`loadtest/sim/engine.py`) with the plain SGLang
simulator and never imports `gateway`.
"""
