"""The servers ftlayer runs itself: the embedded Valkey (and the process's one, used when
no redis_url is set), a test Valkey Cluster, and a topology's state directory."""
