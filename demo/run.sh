#!/usr/bin/env bash
# The demo: installs what it needs, builds and installs durable_ledger, starts
# a throwaway PostgreSQL cluster, tells the story in demo/demo.py with real
# worker processes, and removes the cluster.  `make demo` runs this script.
#
# It says what it will install, and into which PostgreSQL, before it does.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-pg_config}

# What the demo needs from Debian: the build (PGXS), the server, the Python
# driver demo.py uses.  (test/install-deps.sh installs what the tests need.)
packages=(make gcc postgresql-15 postgresql-server-dev-15 python3-psycopg)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if command -v "$PG_CONFIG" >/dev/null; then
	target="$("$PG_CONFIG" --version) ($("$PG_CONFIG" --bindir), as $(command -v "$PG_CONFIG") reports)"
else
	target="Debian's PostgreSQL 15 (postgresql-15, postgresql-server-dev-15)"
fi

if ((${#missing[@]})); then
	if [ "$(id -u)" != 0 ]; then
		echo "The demo needs these Debian packages, which are not installed: ${missing[*]}." >&2
		echo "Run it as root (it installs them with apt-get), or install them first:" >&2
		echo "  sudo apt-get install --no-install-recommends ${missing[*]}" >&2
		exit 1
	fi
	echo "The demo will install these Debian packages with apt-get: ${missing[*]}"
	echo "and then build durable_ledger and install it into $target."
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	echo "Installed: ${missing[*]}."
else
	echo "The Debian packages the demo needs are installed (${packages[*]})."
fi

echo "Building durable_ledger and installing it into $("$PG_CONFIG" --version)" \
	"($("$PG_CONFIG" --bindir); the files go to $("$PG_CONFIG" --pkglibdir) and" \
	"$("$PG_CONFIG" --sharedir)/extension) ..."
make -s -C "$top" install >/dev/null

# The cluster runs as the postgres OS user when this runs as root, and
# PostgreSQL's programs change back into the directory they were started
# from: start them from one that user can enter (the clone may sit under a
# folder only root can enter, such as /root).
cd /tmp
. "$top/test/throwaway-cluster.sh"
echo "Starting a throwaway PostgreSQL cluster ..."
start_throwaway_cluster demo 5433

/usr/bin/python3 "$top/demo/demo.py" --dsn "$dsn"
echo "Removing the throwaway cluster."
