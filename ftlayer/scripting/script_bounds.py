"""How much work one server-side script call may do, so no call holds the server long.

Redis runs a Lua script to the end before it serves any other client, so a
script whose work grows with the backlog (a timeout scan over an expired
bucket, a channel read, a trim of finished stream entries) would block every
client, PINGs included, for as long as it runs. Each such script therefore
stops at whichever comes first of:

- ``max records``: record ids examined in the call;
- ``max bytes``: bytes of record values moved (copied into ``failed``, or
  returned to the reader);
- ``budget ms``: the server's CPU time spent in the call (Lua ``os.clock``;
  ``TIME`` is frozen inside a script), a guard for slow machines and large
  values alike;

and returns a cursor; the Python caller loops over calls until the work is
done. Each call makes progress (at least one record), and the cursor is kept
in Redis state (the unscanned rest of a bucket blob) or returned to the caller
(stream id plus position inside the entry), so no record is skipped or seen
twice between chunks.

Scripts whose work grows with the size of the call (persist, flush, replay,
requeue) are bounded by the callers, which split their input into calls of at
most :data:`CALL_MAX_RECORDS` records and :data:`CALL_MAX_BYTES` bytes.

Figures (valkey 9 on the shared 2-core test machine, other runs' Spark busy; layout format 2,
one hash entry per record; format 3's chunks make persists and reads several times cheaper):
a timeout-scan call of 500 records took 10-20 ms (up to ~40 ms when the
server lost the CPU), a channel read of 5,000 records about 15 ms, a persist
of 1,000 records about 13 ms; 200,000 records timing out at once took about
400 EXPIRE calls or more, against calls of 2.4 s before the bounds.
"""

from __future__ import annotations

#: Wall-time budget of one scanning script call (checked inside the script).
SCRIPT_BUDGET_MS = 10
#: Records one timeout-scan (EXPIRE) call examines at most.
EXPIRE_MAX_RECORDS = 500
#: Record ids one channel read (READ_CHANNEL) examines at most.
READ_MAX_RECORDS = 5_000
#: Record ids one TRIM_DONE call examines at most.
TRIM_MAX_RECORDS = 5_000
#: Value bytes one scanning call moves at most (the record that crosses it is the last one).
SCRIPT_MAX_BYTES = 4 << 20
#: Records per persist / replay / requeue call (callers split larger inputs; a chunk is never split,
#: so a call holds at least one). Filing is a few operations per chunk (format 3), ~1.5 ms per call.
CALL_MAX_RECORDS = 4_096
#: Chunks per persist call (many one-record chunks, as records made one by one give, cost ~5 us each).
CALL_MAX_CHUNKS = 1_024
#: Deltas per FLUSH call: a sink task's flush of more goes in several calls (FLUSH is ~5 us a delta).
FLUSH_MAX_RECORDS = 5_000
#: Frame bytes per persist / replay / requeue call (a single larger frame goes alone).
CALL_MAX_BYTES = 4 << 20

