"""Admission: classify → queue → dispatch. Pure decision code on an injected clock, plus the anyio shell."""
