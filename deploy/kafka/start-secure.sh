#!/bin/sh
# The Kafka broker of deploy/docker-compose.yml and deploy/k8s/kafka.yaml, credentials on (the
# ConfigMap kafka-start in deploy/k8s/kafka.yaml holds a copy of this file, kept equal by
# tests/unit/test_deploy_manifests.py). For the apache/kafka image (KRaft, one node).
#
#   start-secure.sh format   formats the storage once, with one SCRAM user per password file
#   start-secure.sh          the same, then runs the broker
#
# Settings as mint/dev/services/server-secure.properties.in (`mint dev up --secure`): clients log in
# with SASL/SCRAM-SHA-256 on :9092; the StandardAuthorizer denies what no ACL allows (the ACLs
# come from `mint security apply`); `admin` is the super user. The controller listener is
# PLAINTEXT on loopback only: its ANONYMOUS principal (a super user) is the node itself.
# SCRAM users can only be added at format time this way: a data volume formatted before the
# password files changed keeps the old ones (start over with fresh volumes).
#
# Environment: KAFKA_ADVERTISED_LISTENERS (SASL_PLAINTEXT://<host>:9092), SECRETS_DIR (the
# kafka-<principal> password files, default /run/secrets/mint; `start` needs kafka-admin only),
# KAFKA_HEAP_OPTS (read by kafka-server-start.sh); BROKER_BIN, BROKER_DATA and BROKER_CONF
# default to the image's folders (the unit test runs this script with stand-ins).
set -eu
mode=${1:-start}
secrets=${SECRETS_DIR:-/run/secrets/mint}
bin=${BROKER_BIN:-/opt/kafka/bin}
data=${BROKER_DATA:-/var/lib/kafka/data}
conf=${BROKER_CONF:-/tmp/mint-kafka}

umask 077
mkdir -p "$conf"
admin_password=$(cat "$secrets/kafka-admin")
scram="org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\""
scram="$scram password=\"$admin_password\";"

cat >"$conf/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:9093
listeners=SASL_PLAINTEXT://:9092,CONTROLLER://127.0.0.1:9093
advertised.listeners=${KAFKA_ADVERTISED_LISTENERS:?set KAFKA_ADVERTISED_LISTENERS}
controller.listener.names=CONTROLLER
inter.broker.listener.name=SASL_PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-256
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-256
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=$scram
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin;User:ANONYMOUS
log.dirs=$data
num.partitions=3
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
EOF

# the healthcheck / readiness probe logs in as admin with this file
cat >"$conf/admin.properties" <<EOF
security.protocol=SASL_PLAINTEXT
sasl.mechanism=SCRAM-SHA-256
sasl.jaas.config=$scram
EOF

if [ ! -f "$data/meta.properties" ]; then
  set --
  for file in "$secrets"/kafka-*; do
    [ -r "$file" ] || { echo "no password files in $secrets" >&2; exit 1; }
    set -- "$@" --add-scram "SCRAM-SHA-256=[name=${file##*/kafka-},password=$(cat "$file")]"
  done
  echo "formatting $data with $(($# / 2)) SCRAM users"
  # (stdout: it lists every user's salted SCRAM keys; errors go to stderr)
  "$bin/kafka-storage.sh" format --standalone --config "$conf/server.properties" \
    --cluster-id "$("$bin/kafka-storage.sh" random-uuid)" "$@" >/dev/null
fi
[ "$mode" = format ] && exit 0
exec "$bin/kafka-server-start.sh" "$conf/server.properties"
