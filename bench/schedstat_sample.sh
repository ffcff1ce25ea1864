#!/usr/bin/env bash
# bench/schedstat_sample.sh — where a running server's threads spend their time, without perf's overhead: samples
# /proc/PID/task/*/schedstat (ns on a CPU, ns waiting in the run queue, timeslices) of the first process whose command
# line matches PATTERN (pgrep -f), about once a second, until it exits. Differences between two samples of a thread
# give its on-CPU and run-queue shares of that interval; the rest of the interval it was blocked (I/O, locks, idle).
# Usage: bench/schedstat_sample.sh PATTERN OUT   (lines: "unix_time tid comm oncpu_ns runqueue_ns timeslices")
set -u
pattern="$1"; out="$2"
while :; do pid=$(pgrep -f "$pattern" | head -n1); [ -n "$pid" ] && break; sleep 0.5; done
while kill -0 "$pid" 2>/dev/null; do
  t=$(date +%s.%N)
  for d in /proc/"$pid"/task/*; do
    s=$(cat "$d/schedstat" 2>/dev/null) || continue
    echo "$t $(basename "$d") $(tr ' ' _ < "$d/comm" 2>/dev/null) $s"
  done >> "$out"
  sleep 1
done
