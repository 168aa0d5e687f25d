"""Tenants, API keys, token quotas and the admin API; sqlite embedded store, redis shared store."""
