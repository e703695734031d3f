#!/usr/bin/env bash
# Stop the broker started by start.sh DATA_DIR: TERM, wait up to 20 s, then KILL.
# Succeeds quietly when nothing is running.
set -euo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 DATA_DIR" >&2; exit 2; }
pidfile=$1/broker.pid
[[ -f $pidfile ]] || exit 0
pid=$(cat "$pidfile")
# Alive = exists and is not a zombie (a zombie still answers kill -0).
alive() { local st; st=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1; st=${st##*) }; [[ ${st%% *} != Z ]]; }

# Only signal the PID if it is still our broker (PIDs get reused).
if [[ $pid =~ ^[0-9]+$ ]] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q 'kafka\.Kafka'; then
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do   # 100 x 0.2 s = 20 s
    alive || break
    sleep 0.2
  done
  if alive; then
    echo "stop.sh: broker $pid did not stop in 20 s, sending KILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 50); do alive || break; sleep 0.1; done
  fi
fi
rm -f "$pidfile"
