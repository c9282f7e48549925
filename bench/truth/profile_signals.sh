#!/bin/bash
# `smlens profile` killed by SIGINT, SIGTERM or SIGKILL while it captures (6 s after its start) and while it
# evaluates and writes the report (13 s): after each, nothing of its process group may be left, stderr may
# hold one sentence but no traceback or resource_tracker line, and nothing may stay in /dev/shm.
# Run from the repository root on a GPU host, with the environment `smlens profile` needs (docs/profile.md):
#   bash bench/truth/profile_signals.sh
# Started by a script, each capture inherits the shell's ignored SIGINT (a background job's), which smlens
# overrides only while it captures; docs/profile.md ("How a capture works") says what it guards.
for sig in INT TERM KILL; do
  for when in 6 13; do
    setsid python3 -m smlens profile --gpu 0 --seconds 10 --interval-us 100 --out "/tmp/signals-$sig-$when.html" \
      > /tmp/signals.out 2> /tmp/signals.err &
    leader=$!
    sleep "$when"
    pgid=$(ps -o pgid= -p "$leader" | tr -d ' ')
    before=$(ps -o pid=,comm= -g "$pgid" | wc -l)
    kill "-$sig" "$leader"
    sleep 4
    left=$(ps -o pid=,args= -g "$pgid" 2>/dev/null)
    wait "$leader"
    rc=$?
    echo "== SIG$sig at ${when}s: rc=$rc group_before=$before survivors=[${left}]"
    echo "   stderr: $(tr '\n' '|' < /tmp/signals.err | tail -c 600)"
    echo "   traceback/tracker lines: $(grep -c -iE 'traceback|resource_tracker|leaked' /tmp/signals.err)"
    kill -KILL "-$pgid" 2>/dev/null
  done
done
echo "left in /dev/shm: $(ls /dev/shm | wc -l)"
