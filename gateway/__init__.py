"""omnigate: an admission-control gateway for multimodal LLM serving."""

__version__ = "0.1.0"
