#!/usr/bin/env bash
# Start a single-node KRaft Kafka broker on 127.0.0.1 in the background.
# Usage: start.sh DATA_DIR [PORT=19092] [CONTROLLER_PORT=19093]
# Prints the bootstrap servers (127.0.0.1:PORT) once the broker accepts connections.
# Env: KAFKA_START_TIMEOUT (s, default 90), KAFKA_HEAP_OPTS (default -Xmx512m -Xms256m).
set -euo pipefail

[[ $# -ge 1 && $# -le 3 ]] || { echo "usage: $0 DATA_DIR [PORT] [CONTROLLER_PORT]" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$1"
data=$(cd "$1" && pwd)
port=${2:-19092}
cport=${3:-19093}
timeout=${KAFKA_START_TIMEOUT:-90}
java=${JAVA_HOME:+$JAVA_HOME/bin/}java
log=$data/broker.log
pidfile=$data/broker.pid

die() { echo "start.sh: $*" >&2; exit 1; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

[[ $port != "$cport" ]] || die "PORT and CONTROLLER_PORT must differ"
if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  die "a broker is already running from $data (pid $(cat "$pidfile")); run stop.sh $data first"
fi
for p in "$port" "$cport"; do
  ! port_open "$p" || die "port $p on 127.0.0.1 is already in use"
done

lib=$("$here/fetch.sh")
cp="$lib/*"   # literal wildcard: java expands it

# Config is rewritten on every start (ports may change); data lives in $data/kraft.
cat >"$data/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
log.dirs=$data/kraft
auto.create.topics.enable=false
num.partitions=1
# single node: replication 1 everywhere, few internal partitions (fast start)
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# small machine: little memory and few threads
log.cleaner.dedupe.buffer.size=16777216
num.network.threads=2
num.io.threads=2
PROPS

# Format the storage once (meta.properties marks a formatted log dir).
if [[ ! -f $data/kraft/meta.properties ]]; then
  cluster_id=$("$java" -cp "$cp" kafka.tools.StorageTool random-uuid 2>>"$log")
  "$java" -cp "$cp" -Dlog4j2.configurationFile="$here/log4j2.properties" \
    kafka.tools.StorageTool format -t "$cluster_id" -c "$data/server.properties" >>"$log" 2>&1 ||
    { tail -n 40 "$log" >&2; die "formatting $data/kraft failed"; }
fi

# Start detached from our stdio so callers capturing our output don't hang.
# shellcheck disable=SC2086  # KAFKA_HEAP_OPTS is a list of JVM flags
nohup "$java" ${KAFKA_HEAP_OPTS:--Xmx512m -Xms256m} -XX:+UseG1GC -Djava.awt.headless=true \
  -Dlog4j2.configurationFile="$here/log4j2.properties" \
  -cp "$cp" kafka.Kafka "$data/server.properties" >>"$log" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$pidfile"

# Ready = the broker port accepts TCP connections; fail fast if the JVM exits.
deadline=$((SECONDS + timeout))
until port_open "$port"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    tail -n 40 "$log" >&2; rm -f "$pidfile"; die "broker exited during startup (log: $log)"
  fi
  if ((SECONDS >= deadline)); then
    tail -n 40 "$log" >&2; "$here/stop.sh" "$data"; die "broker not ready after ${timeout}s (log: $log)"
  fi
  sleep 0.2
done
echo "127.0.0.1:$port"
