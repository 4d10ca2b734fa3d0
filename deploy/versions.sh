# The versions of the local stack's servers and tools, and where they are installed
# (sourced by deploy/install.sh and deploy/stack.sh).
KAFKA_VERSION=4.1.1
LOG4J_VERSION=2.24.3
SLF4J_VERSION=2.0.17
OPENSEARCH_VERSION=2.19.6
# The second, secured OpenSearch node (stack service opensearch-secure): the security plugin
# must match the server's version exactly, and Maven Central serves no opensearch-security
# 2.19.6.0 (nor 2.19.5.0); 2.19.4 is the newest 2.19 with both the minimal distribution and
# the plugin (2.19.4.0).
OPENSEARCH_SECURE_VERSION=2.19.4
ELASTICSEARCH_VERSION=7.17.29
# The Elasticsearch whose Painless module Maven Central serves (stack service
# elasticsearch-painless: area updates on Elasticsearch), with this log4j in place of its own.
ELASTICSEARCH_PAINLESS_VERSION=7.10.2
ELASTICSEARCH_PAINLESS_LOG4J=2.17.1
NEXTEST_VERSION=0.9.148
# Debezium's embedded engine and MySQL connector: the peer integration-tests/debezium/run.sh
# measures (installed on first use). Maven Central serves no debezium-connector-mariadb
# 3.6.x; its newest is the version below, used for a MariaDB source.
DEBEZIUM_VERSION=3.6.1.Final
DEBEZIUM_MARIADB_VERSION=3.5.0.Final
MAVEN=https://repo1.maven.org/maven2
# OpenSearch refuses to run as root: as root, the stack runs it as this user.
SEARCH_USER=sluice-search
if [ -z "${SLUICE_TOOLS:-}" ]; then
  if [ "$(id -u)" = 0 ]; then SLUICE_TOOLS=/opt/sluice; else SLUICE_TOOLS="$HOME/.local/lib/sluice"; fi
fi
# A JDK 17 or newer for Kafka and OpenSearch: JAVA_HOME when set, else the java on PATH.
if [ -z "${JAVA_HOME:-}" ] && command -v java >/dev/null 2>&1; then
  JAVA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")
fi
