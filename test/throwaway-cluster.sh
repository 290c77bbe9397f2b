# throwaway-cluster.sh: sourced by demo/run.sh and bench/run.sh.
#
#   install_extension TOP
#
# installs the Debian packages when run as root, then builds and installs
# the extension from the source tree TOP.
#
#   start_throwaway_cluster NAME PORT [postgresql.conf lines ...]
#
# initdb's a cluster in a new /tmp folder (as the postgres OS user when run
# as root: initdb and postgres refuse root), starts it on a Unix socket only,
# creates the extension, and sets $work, $bindir and $dsn.  An EXIT trap
# stops the cluster and removes the folder.

install_extension() {
	if [ "$(id -u)" = 0 ]; then
		echo "installing what the build and the tests need from Debian's packages, where missing (test/install-deps.sh) ..."
		"$1/test/install-deps.sh" >/dev/null
	fi
	echo "building durable_ledger and installing it into PostgreSQL $("${PG_CONFIG:-pg_config}" --version | sed 's/^PostgreSQL //') at $("${PG_CONFIG:-pg_config}" --pkglibdir) ..."
	make -s -C "$1" install >/dev/null
}

start_throwaway_cluster() {
	local name=$1 port=$2
	shift 2

	bindir=$("${PG_CONFIG:-pg_config}" --bindir)
	work=$(mktemp -d "/tmp/durable_ledger_$name.XXXXXX")
	chmod 755 "$work"
	if [ "$(id -u)" = 0 ]; then
		chown postgres: "$work"
		as_cluster_user() { runuser -u postgres -- "$@"; }
	else
		as_cluster_user() { "$@"; }
	fi
	# the cluster user's programs start in the current directory: one it can
	# enter (a clone under /root is not), or they say so on every start
	cd "$work"
	trap 'as_cluster_user "$bindir/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

	as_cluster_user "$bindir/initdb" -D "$work/data" -A trust -U postgres >/dev/null
	{
		echo "listen_addresses = ''"
		echo "unix_socket_directories = '$work'"
		echo "port = $port"
		printf '%s\n' "$@"
	} | as_cluster_user tee -a "$work/data/postgresql.conf" >/dev/null
	as_cluster_user "$bindir/pg_ctl" -D "$work/data" -l "$work/server.log" -w start >/dev/null
	dsn="host=$work port=$port dbname=postgres user=postgres"
	as_cluster_user "$bindir/psql" -X -q -d "$dsn" -c 'CREATE EXTENSION durable_ledger' >/dev/null
}
