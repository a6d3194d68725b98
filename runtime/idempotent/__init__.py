"""Effectively-once sinks: writes keyed by lineage id, so a replay never shows a record twice.

ftlayer replays a failed record under a new source record id but keeps its origin id and root
current id, so each output has the same lineage id on every attempt (``ftlayer.records.lineage``). A sink
that writes each output under its lineage id with a unique constraint (or merges on it) drops a
replay whose first attempt already reached it. Modules, one target each: ``postgres`` (psycopg 3,
``INSERT ... ON CONFLICT DO NOTHING``), ``delta`` (a Delta table merged on the id, through
delta-rs), ``redis_hash`` (a Redis hash, one field per id, written once). Each gives a ``foreachBatch`` function for
the DataFrame path (wrap it in ``ftlayer.acking``) and an ``ExecutorSink`` for the Topology path;
``keyed`` picks the columns a DataFrame-path sink writes.
"""
