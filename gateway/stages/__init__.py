"""The request's stages, in the order the pipeline (gateway/http/pipeline.py) calls them.

authenticate (key → tenant) → admit (classify, route, price, reserve quota) → [the pool's scheduler queues
and dispatches; the proxy opens and relays] → finish (reconcile quota, then measure: metrics, SLO
tracking, output learning, failure alerts, access log). Each stage is one small object built once by the
composition root (gateway/process/replica.py) from what it needs, and called once per request.
"""
