"""The record format and ids: frames, chunks, ids, key hashes, lineage (pure: no Redis)."""
