"""Modality buckets: the admission stage caps each bucket separately (multi-image prefills are heavy)."""

from __future__ import annotations

from gateway.estimate.settings import BucketPolicy
from gateway.request.ticket import Cost


def classify(cost: Cost, policy: BucketPolicy, *, speaks: bool = False) -> str:
    """The first bucket in `policy.order` whose condition holds; `text` always holds. `speech`: the answer
    speaks (the talker and code2wav work for it)."""
    holds = {
        "speech": speaks,
        "video": cost.videos > 0,
        "audio": cost.audios > 0,
        "multi_image": cost.images >= policy.multi_image_min,
        "single_image": 0 < cost.images < policy.multi_image_min,
        "long_doc": cost.prompt_tokens > policy.long_doc_prompt_tokens,
        "text": True,
    }
    return next(name for name in policy.order if holds[name])
