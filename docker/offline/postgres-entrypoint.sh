#!/usr/bin/env bash
# Debian's PostgreSQL in a container (offline/Dockerfile.postgres), started as the official postgres image
# starts: on the first start (an empty PGDATA) it makes the cluster with the superuser POSTGRES_USER, whose
# password it reads from POSTGRES_PASSWORD_FILE (never from a command line), creates POSTGRES_DB and runs
# /docker-entrypoint-initdb.d/*.sql while listening on its socket only; then it serves on port 5432 (any
# address, password required: scram-sha-256) as the user postgres. Any failure is one line on stderr.
set -euo pipefail

die() {
  echo "postgres-entrypoint: $*" >&2
  exit 78
}

bin=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d | sort -V | tail -n 1)
[[ -n $bin ]] || die "no PostgreSQL server under /usr/lib/postgresql"
export PGDATA=${PGDATA:-/var/lib/postgresql/data}
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; }

[[ $(id -u) == 0 ]] || die "start me as root: I hand PGDATA and the server to the user postgres"
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 0700 "$PGDATA"

if [[ ! -s $PGDATA/PG_VERSION ]]; then
  if [[ -n ${POSTGRES_PASSWORD_FILE:-} ]]; then
    [[ -s $POSTGRES_PASSWORD_FILE ]] || die "POSTGRES_PASSWORD_FILE=$POSTGRES_PASSWORD_FILE is missing or empty"
    password=$(<"$POSTGRES_PASSWORD_FILE")
  elif [[ -n ${POSTGRES_PASSWORD:-} ]]; then
    password=$POSTGRES_PASSWORD
  else
    die "no password for $user: set POSTGRES_PASSWORD_FILE to the file that holds it"
  fi
  pwfile=$(mktemp)
  printf '%s\n' "$password" >"$pwfile"
  chown postgres "$pwfile"
  # UTF-8 as the official image (without a locale initdb picks SQL_ASCII, whose text psycopg returns as bytes)
  as_postgres "$bin/initdb" -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust \
    --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null || die "initdb failed"
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  as_postgres "$bin/pg_ctl" -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  psql=(as_postgres "$bin/psql" -v ON_ERROR_STOP=1 -q -U "$user")
  [[ $db == postgres ]] || "${psql[@]}" -d postgres -c "CREATE DATABASE \"$db\"" || die "could not create $db"
  for script in /docker-entrypoint-initdb.d/*.sql; do
    [[ -e $script ]] || continue
    "${psql[@]}" -d "$db" -f "$script" || die "$script failed"
  done
  as_postgres "$bin/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
  echo "postgres-entrypoint: made the cluster in $PGDATA (user $user, database $db)"
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups -- "$bin/postgres" -D "$PGDATA"
