"""`omnigate top`: a live terminal view of a running gateway, from its /admin/state, /metrics and usage."""
