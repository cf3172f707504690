# Sourced by bench/embed_scale.sh and bench/embed_screen_scale.sh (not run): the one way both
# kill an embedding halfway and resume it, so their resume figures mean the same thing.
# kill_halfway_and_rerun KEY N OUT PARTS ARGS...: runs `embed ARGS...` (the caller's exported
# function) in the background, SIGKILLs it once half of the PARTS parts of OUT are written,
# reruns the same command under GNU time and appends the rerun's JSON line
# ({"run": "rerun", KEY: N, "parts_kept", "parts", "wall_s", "max_rss_mib"}) to
# $WORK/runs.jsonl. Logs: $WORK/killed.log, $WORK/rerun.log.
kill_halfway_and_rerun() {
  local key=$1 n=$2 out=$3 parts=$4
  shift 4
  local t0 t1 pid done_parts kept wall rss_kb
  t0=$(date +%s.%N)
  embed "$@" >"$WORK/killed.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    done_parts=$( (find "$out.parts" -name 'part-*.json' 2>/dev/null || true) | wc -l)
    ((done_parts * 2 >= parts)) && break
    sleep 1
  done
  kill -9 "$pid" 2>/dev/null || echo "the job finished before it could be killed: use a larger N"
  wait "$pid" 2>/dev/null || true
  t1=$(date +%s.%N)
  kept=$(find "$out.parts" -name 'part-*.json' | wc -l)
  echo "killed with SIGKILL after $(echo "$t1 - $t0" | bc) s with $kept of $parts parts finished"
  /usr/bin/time -f '%e %M' -o "$WORK/time.txt" bash -c 'embed "$@"' _ "$@" >"$WORK/rerun.log" 2>&1
  read -r wall rss_kb <"$WORK/time.txt"
  echo "{\"run\": \"rerun\", \"$key\": $n, \"parts_kept\": $kept, \"parts\": $parts, \"wall_s\": $wall, \"max_rss_mib\": $((rss_kb / 1024))}" |
    tee -a "$WORK/runs.jsonl"
}
