"""One source as a whole: its virtual shards, the FTLayer facade every caller goes through,
and the driver's FTService loop (rotate, expire, replay)."""
