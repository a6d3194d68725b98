"""The names of a source's Redis keys and the hash tags of its virtual shards (pure)."""
