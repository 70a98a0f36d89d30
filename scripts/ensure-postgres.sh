#!/usr/bin/env bash
# Make a PostgreSQL server reachable on 127.0.0.1:5432 for the test suite, with a database
# `tilesearch_test`: use a running one, else start the installed cluster, else install it
# from Debian's packages (a fresh machine). Idempotent; prints what it did.
set -euo pipefail
PGHOST=127.0.0.1
PGPORT=5432
DB=tilesearch_test

ready() { pg_isready -q -h "$PGHOST" -p "$PGPORT" 2>/dev/null; }

if ! command -v pg_isready >/dev/null 2>&1 || ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
  echo "postgres: not installed, installing from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
fi

if ! ready; then
  echo "postgres: starting the local cluster"
  ver=$(ls /etc/postgresql | sort -V | tail -n1)
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
  for _ in $(seq 1 30); do ready && break; sleep 1; done
fi
ready || { echo "postgres: server not reachable on $PGHOST:$PGPORT" >&2; exit 1; }

# Trust auth on local TCP is these machines' default. A freshly installed Debian cluster asks
# for a password on TCP instead: give the postgres role the one the test URL carries.
psql_as() { psql -h "$PGHOST" -p "$PGPORT" -U postgres -tAc "$1" 2>/dev/null || su postgres -c "psql -tAc \"$1\""; }
if ! PGPASSWORD=postgres psql -h "$PGHOST" -p "$PGPORT" -U postgres -tAc "SELECT 1" >/dev/null 2>&1; then
  su postgres -c "psql -tAc \"ALTER USER postgres PASSWORD 'postgres'\"" >/dev/null
fi
if [ "$(psql_as "SELECT 1 FROM pg_database WHERE datname='$DB'")" != "1" ]; then
  psql_as "CREATE DATABASE $DB" >/dev/null
  echo "postgres: created database $DB"
fi
echo "postgres: ready at postgresql://postgres:postgres@$PGHOST:$PGPORT/$DB"
