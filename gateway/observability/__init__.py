"""Metrics, access log, alert rules and webhook notifiers."""
