"""Talking to Redis: clients per URL, riding out outages, one shard's handle (SourceStore),
the layout version, and the server settings and commands ftlayer needs."""
