"""The read model of a namespace (``ftlayer status``, metrics, the listener), what ingest is
doing, and one source's keys as a whole (describe, reset)."""
