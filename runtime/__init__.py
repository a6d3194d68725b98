"""Runtime: FT handlers, the topology API and its compilation to Spark, the FT service, the CLI."""
