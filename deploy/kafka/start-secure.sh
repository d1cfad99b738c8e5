#!/bin/sh
# A Kafka broker of deploy/docker-compose.yml and deploy/k8s/kafka.yaml, credentials on (the
# ConfigMap kafka-start in deploy/k8s/kafka.yaml holds a copy of this file, kept equal by
# tests/unit/test_deploy_manifests.py). For the apache/kafka image: KRaft combined mode (broker
# and controller in one process), one voter of a static quorum, as the local cluster
# (MINT_DEV_NODES=3: mint/dev/services/server.properties.in and mint/dev/jvm.py).
#
#   start-secure.sh format   formats the storage once, with one SCRAM user per password file
#   start-secure.sh          the same, then runs the broker
#
# Credentials as mint/dev/services/server-secure.properties.in (`mint dev up --secure`): clients
# and the other brokers log in with SASL/SCRAM-SHA-256 on :9092; the StandardAuthorizer denies
# what no ACL allows (the ACLs come from `mint security apply`); `admin` is the super user. The
# controller listener (:9093) is where the other voters reach this one, so it is on the network
# too and takes SASL/PLAIN logins of admin only (a controller cannot check SCRAM logins: their
# credentials live in the metadata it serves); nobody is an ANONYMOUS super user. PLAIN sends
# admin's password as it is: never publish :9093 (SASL_SSL once the listeners have TLS).
# SCRAM users can only be added at format time this way: a data volume formatted before the
# password files changed keeps the old ones (start over with fresh volumes).
#
# Replication as the local cluster: factor min(3, voters), min.insync.replicas one less (2 of 3),
# the internal topics (offsets, transactions, share groups) included; a broker that misses its
# heartbeats for 2 s is fenced, a lost active controller is replaced after 1 s, a follower that
# stops fetching leaves the ISR after 5 s: together they bound how long a partition has no
# leader or holds acks=all writes (mint/dev/jvm.py CLUSTER_BROKER_TIMINGS, the same values).
#
# Environment: KAFKA_CONTROLLER_QUORUM_VOTERS (every voter, id@host:9093,…, the same on every
# node), KAFKA_NODE_ID (this node's id; unset: the ordinal of the StatefulSet pod POD_NAME, or of
# the hostname, <name>-<ordinal>, plus one), KAFKA_CLUSTER_ID (the same on every node; a random
# one for a single voter without it), KAFKA_ADVERTISED_LISTENERS (SASL_PLAINTEXT://<host>:9092),
# SECRETS_DIR (the kafka-<principal> password files, default /run/secrets/mint; `start` needs
# kafka-admin only), KAFKA_HEAP_OPTS (read by kafka-server-start.sh); BROKER_BIN, BROKER_DATA and
# BROKER_CONF default to the image's folders (the unit test runs this script with stand-ins).
set -eu
mode=${1:-start}
secrets=${SECRETS_DIR:-/run/secrets/mint}
bin=${BROKER_BIN:-/opt/kafka/bin}
data=${BROKER_DATA:-/var/lib/kafka/data}
conf=${BROKER_CONF:-/tmp/mint-kafka}

voters=${KAFKA_CONTROLLER_QUORUM_VOTERS:?set KAFKA_CONTROLLER_QUORUM_VOTERS (id@host:9093,...)}
node=${KAFKA_NODE_ID:-}
if [ -z "$node" ]; then
  pod=${POD_NAME:-$(hostname)}
  ordinal=${pod##*-}
  case $ordinal in
    '' | *[!0-9]*) echo "set KAFKA_NODE_ID: $pod is not a StatefulSet pod <name>-<ordinal>" >&2; exit 1 ;;
  esac
  node=$((ordinal + 1))
fi
case ",$voters," in
  *",$node@"*) ;;
  *) echo "node $node is not one of the voters $voters" >&2; exit 1 ;;
esac
nodes=0
rest=$voters,
while [ -n "$rest" ]; do
  nodes=$((nodes + 1))
  rest=${rest#*,}
done
rf=$((nodes < 3 ? nodes : 3))
min_isr=$((rf > 1 ? rf - 1 : 1))

umask 077
mkdir -p "$conf"
admin_password=$(cat "$secrets/kafka-admin")
scram="org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\""
scram="$scram password=\"$admin_password\";"
plain="org.apache.kafka.common.security.plain.PlainLoginModule required username=\"admin\""
plain="$plain password=\"$admin_password\" user_admin=\"$admin_password\";"

cat >"$conf/server.properties" <<CONF
process.roles=broker,controller
node.id=$node
controller.quorum.voters=$voters
listeners=SASL_PLAINTEXT://:9092,CONTROLLER://:9093
advertised.listeners=${KAFKA_ADVERTISED_LISTENERS:?set KAFKA_ADVERTISED_LISTENERS}
controller.listener.names=CONTROLLER
inter.broker.listener.name=SASL_PLAINTEXT
listener.security.protocol.map=CONTROLLER:SASL_PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-256
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-256
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=$scram
listener.name.controller.sasl.enabled.mechanisms=PLAIN
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.plain.sasl.jaas.config=$plain
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin
log.dirs=$data
num.partitions=3
default.replication.factor=$rf
min.insync.replicas=$min_isr
offsets.topic.replication.factor=$rf
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$min_isr
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$min_isr
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=2000
controller.quorum.fetch.timeout.ms=1000
controller.quorum.election.timeout.ms=500
controller.quorum.election.backoff.max.ms=200
replica.lag.time.max.ms=5000
CONF

# the healthcheck / readiness probe logs in as admin with this file
cat >"$conf/admin.properties" <<CONF
security.protocol=SASL_PLAINTEXT
sasl.mechanism=SCRAM-SHA-256
sasl.jaas.config=$scram
CONF

if [ ! -f "$data/meta.properties" ]; then
  cluster_id=${KAFKA_CLUSTER_ID:-}
  if [ -z "$cluster_id" ]; then
    [ "$nodes" = 1 ] || { echo "set KAFKA_CLUSTER_ID, the same on every voter" >&2; exit 1; }
    cluster_id=$("$bin/kafka-storage.sh" random-uuid)
  fi
  set --
  for file in "$secrets"/kafka-*; do
    [ -r "$file" ] || { echo "no password files in $secrets" >&2; exit 1; }
    set -- "$@" --add-scram "SCRAM-SHA-256=[name=${file##*/kafka-},password=$(cat "$file")]"
  done
  echo "formatting $data as node $node of $nodes with $(($# / 2)) SCRAM users"
  # A static quorum (controller.quorum.voters): no --standalone. (stdout: it lists every user's
  # salted SCRAM keys; errors go to stderr)
  "$bin/kafka-storage.sh" format --config "$conf/server.properties" \
    --cluster-id "$cluster_id" "$@" >/dev/null
fi
[ "$mode" = format ] && exit 0
exec "$bin/kafka-server-start.sh" "$conf/server.properties"
