"""The FT components over one shard's store: the acker table and flush tokens, persistence
and the channel-count policy, timeouts (rotating bucket map) and holds, the replayer,
dead letters, batch acks and the sink breaker."""
