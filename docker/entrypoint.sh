#!/usr/bin/env bash
# The studyrunner image's entrypoint: one image, one role per container.
#
#   entrypoint.sh head   [ray start options]     Ray head; 0 CPUs and 0 GPUs for trials, so trials run on workers
#   entrypoint.sh worker [ray start options]     Ray worker joining the head at $RAY_ADDRESS
#   entrypoint.sh mlflow [mlflow server options] MLflow tracking server, artifacts proxied to the object store
#   entrypoint.sh submit STUDY.yaml [options]    `studyrunner submit STUDY.yaml` into the cluster
#   entrypoint.sh submit COMMAND [args]          any studyrunner command: status, results, analyze, resume, ...
#   entrypoint.sh health ROLE                    the container health check of a role (exit 0: healthy)
#   entrypoint.sh secrets [DIR]                  make the cluster's secrets in DIR (default /secrets), once
#   entrypoint.sh PROGRAM [args]                 anything else runs as is (bash, python, ray, ...)
#
# The role is the first argument, or $STUDYRUNNER_ROLE. Before it starts, a role waits for each service its
# environment names (TCP connect, at most $STUDYRUNNER_WAIT_TIMEOUT seconds each, default 120):
#
#   read by studyrunner (docs/concepts.md)     STUDYRUNNER_DB, MLFLOW_TRACKING_URI, STUDYRUNNER_STORAGE, RAY_ADDRESS
#   read by `mlflow server` itself           MLFLOW_BACKEND_STORE_URI, MLFLOW_ARTIFACTS_DESTINATION
#   the object store's endpoint              AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (pyarrow, boto3),
#                                            MLFLOW_S3_ENDPOINT_URL (MLflow's S3 artifact store)
#   secrets, each read from a file           RAY_AUTH_MODE (token unless set) with RAY_AUTH_TOKEN_PATH (Ray),
#                                            PGPASSFILE (libpq: the ledger, MLflow's store),
#                                            AWS_SHARED_CREDENTIALS_FILE (pyarrow, boto3)
#   this script's own                        STUDYRUNNER_ROLE, STUDYRUNNER_WAIT_TIMEOUT, STUDYRUNNER_RAY_PORT (6379),
#                                            STUDYRUNNER_HEAD_CPUS (0), STUDYRUNNER_HEAD_GPUS (0),
#                                            STUDYRUNNER_MLFLOW_PORT (5000), STUDYRUNNER_JOIN_RAY (auto|yes|no),
#                                            STUDYRUNNER_ENTRYPOINT_DRY_RUN (1: print the command, run nothing),
#                                            for `secrets`: STUDYRUNNER_SECRETS_OWNER (1000:1000, who gets the
#                                            files), STUDYRUNNER_PGPASS_HOST (postgres:5432, pgpass's host:port),
#                                            POSTGRES_USER and MINIO_ROOT_USER (studyrunner: the user names)
#
# No secret goes on a command line (every user of the host sees those in `ps`): the roles pass none, and the
# clients read theirs from files (above). A secret file named but missing or empty stops a role with one line.
# Ray runs with token authentication unless RAY_AUTH_MODE=disabled says otherwise; then the head's dashboard
# (and its job API) listens on 127.0.0.1 only.
#
# `submit` runs its command on a Ray node, as Ray requires of a driver: inside a Ray job (KubeRay's RayJob) or a
# container that already runs a raylet it uses that node; otherwise it first joins the cluster as a node with no
# CPUs and no GPUs (so no trial lands there), which lasts as long as the container.
#
# Exit status: 64 bad usage, 78 a variable missing or malformed, 69 a service not reachable in time; otherwise
# the command's own. Every failure is one line on stderr.
set -euo pipefail

readonly EX_USAGE=64 EX_UNAVAILABLE=69 EX_CONFIG=78
ROLES="head|worker|mlflow|submit|health|secrets"

die() {
  local code=$1
  shift
  echo "entrypoint: $*" >&2
  exit "$code"
}

need() { # need VAR HINT: VAR must be set and not empty
  [[ -n ${!1:-} ]] || die "$EX_CONFIG" "$1 is not set (${2})"
}

is_count() { [[ $1 =~ ^[0-9]+$ ]]; }

WAIT_TIMEOUT=${STUDYRUNNER_WAIT_TIMEOUT:-120}
is_count "$WAIT_TIMEOUT" || die "$EX_CONFIG" "STUDYRUNNER_WAIT_TIMEOUT=${WAIT_TIMEOUT@Q} is not a whole number of seconds"

# url_endpoint URL: set HOST and PORT from scheme://[user[:password]@]host[:port][/...], the port defaulting by
# scheme; false for a URL without a host (sqlite:///file, a local path).
url_endpoint() {
  local re='^([A-Za-z][A-Za-z0-9.-]*)(\+[A-Za-z0-9.-]+)?://([^/@]*@)?(\[[0-9A-Fa-f:.]+\]|[^]@:/?#[]+)(:([0-9]+))?([/?#].*)?$'
  [[ $1 =~ $re ]] || return 1
  HOST=${BASH_REMATCH[4]}
  PORT=${BASH_REMATCH[6]}
  HOST=${HOST#[}
  HOST=${HOST%]}
  if [[ -z $PORT ]]; then
    case ${BASH_REMATCH[1],,} in
      postgresql | postgres) PORT=5432 ;;
      mysql) PORT=3306 ;;
      http) PORT=80 ;;
      *) PORT=443 ;;
    esac
  fi
}

# ray_endpoint ADDRESS: set HOST and PORT from a Ray address host:port (or ray://host:port); false otherwise.
ray_endpoint() {
  local re='^(ray://)?(\[[0-9A-Fa-f:.]+\]|[^]@:/?#[]+):([0-9]+)$'
  [[ $1 =~ $re ]] || return 1
  HOST=${BASH_REMATCH[2]}
  PORT=${BASH_REMATCH[3]}
  HOST=${HOST#[}
  HOST=${HOST%]}
}

reachable() { # reachable HOST PORT: a TCP connection opens within 3 s (bash's /dev/tcp, no extra tools)
  # shellcheck disable=SC2016 # expanded by the inner bash, from its arguments
  timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null
}

wait_for() { # wait_for WHAT HOST PORT
  local what=$1 host=$2 port=$3 deadline=$((SECONDS + WAIT_TIMEOUT)) said=""
  until reachable "$host" "$port"; do
    if ((SECONDS >= deadline)); then
      die "$EX_UNAVAILABLE" "$what at $host:$port not reachable after ${WAIT_TIMEOUT}s" \
        "(is it running? STUDYRUNNER_WAIT_TIMEOUT sets how long to wait)"
    fi
    [[ -n $said ]] || { echo "entrypoint: waiting for $what at $host:$port" && said=1; }
    sleep 1
  done
}

wait_for_url() { # wait_for_url VAR WHAT: wait for the service a URL variable names, if it names one
  [[ -n ${!1:-} ]] && url_endpoint "${!1}" || return 0
  wait_for "$2 ($1)" "$HOST" "$PORT"
}

s3_endpoint_var() { # the variable that names the S3 endpoint pyarrow and boto3 use, if any
  local var
  for var in AWS_ENDPOINT_URL_S3 AWS_ENDPOINT_URL; do
    [[ -n ${!var:-} ]] && { echo "$var" && return; }
  done
  return 0
}

wait_for_storage() { # STUDYRUNNER_STORAGE on S3 with an endpoint of its own (MinIO, ...): wait for that endpoint
  local var
  [[ ${STUDYRUNNER_STORAGE:-} == s3://* ]] || return 0
  var=$(s3_endpoint_var)
  [[ -n $var ]] && wait_for_url "$var" "the object store"
  return 0
}

ray_head() { # set HOST and PORT from RAY_ADDRESS, which must be host:port
  need RAY_ADDRESS "the Ray head's host:port, e.g. ray-head:6379"
  ray_endpoint "$RAY_ADDRESS" || die "$EX_CONFIG" "RAY_ADDRESS=${RAY_ADDRESS@Q} is not host:port (e.g. ray-head:6379)"
}

wait_for_ray_head() {
  ray_head
  wait_for "the Ray head (RAY_ADDRESS)" "$HOST" "$PORT"
}

secret_file() { # secret_file VAR WHAT: the file VAR names, if set, must be readable and not empty
  local path=${!1:-}
  [[ -z $path ]] && return 0
  [[ -f $path && -r $path && -s $path ]] ||
    die "$EX_CONFIG" "$1=${path@Q}: $2 is not a readable, non-empty file" \
      "(in the compose cluster the one-shot service \`secrets\` makes it on the first start)"
}

secret_files() { # the secret files this environment names
  secret_file PGPASSFILE "the PostgreSQL password file"
  secret_file AWS_SHARED_CREDENTIALS_FILE "the S3 credentials file"
}

ray_auth() { # Ray's token authentication: on unless RAY_AUTH_MODE says otherwise, and then with a token
  export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
  case $RAY_AUTH_MODE in
    token)
      [[ -n ${RAY_AUTH_TOKEN:-} ]] && return 0
      if [[ -z ${RAY_AUTH_TOKEN_PATH:-} && -s ${HOME:-/nonexistent}/.ray/auth_token ]]; then
        return 0 # Ray's default place
      fi
      [[ -n ${RAY_AUTH_TOKEN_PATH:-} ]] ||
        die "$EX_CONFIG" "RAY_AUTH_MODE=token, but no token: set RAY_AUTH_TOKEN_PATH to the file that holds" \
          "the cluster's token, the same on every node (RAY_AUTH_MODE=disabled turns authentication off)"
      secret_file RAY_AUTH_TOKEN_PATH "the Ray token"
      ;;
    disabled)
      echo "entrypoint: RAY_AUTH_MODE=disabled: whoever reaches this Ray cluster can run code in it;" \
        "the dashboard listens on 127.0.0.1 only" >&2
      ;;
    *) die "$EX_CONFIG" "RAY_AUTH_MODE=${RAY_AUTH_MODE@Q} is not token or disabled" ;;
  esac
}

raylet_here() { # a raylet runs in this container
  local comm name
  for comm in /proc/[0-9]*/comm; do
    read -r name <"$comm" 2>/dev/null || continue
    [[ $name == raylet ]] && return 0
  done
  return 1
}

run() { # exec the command, or print it (dry run)
  if [[ ${STUDYRUNNER_ENTRYPOINT_DRY_RUN:-} == 1 ]]; then
    echo "${*@Q}"
    exit 0
  fi
  exec "$@"
}

role_head() {
  local port=${STUDYRUNNER_RAY_PORT:-6379} cpus=${STUDYRUNNER_HEAD_CPUS:-0} gpus=${STUDYRUNNER_HEAD_GPUS:-0}
  is_count "$port" || die "$EX_CONFIG" "STUDYRUNNER_RAY_PORT=${port@Q} is not a port number"
  is_count "$cpus" || die "$EX_CONFIG" "STUDYRUNNER_HEAD_CPUS=${cpus@Q} is not a whole number"
  is_count "$gpus" || die "$EX_CONFIG" "STUDYRUNNER_HEAD_GPUS=${gpus@Q} is not a whole number"
  ray_auth
  secret_files
  # The dashboard takes jobs: open to the network only behind the token.
  local dashboard=0.0.0.0
  [[ $RAY_AUTH_MODE == token ]] || dashboard=127.0.0.1
  run ray start --head --port="$port" --dashboard-host="$dashboard" --num-cpus="$cpus" --num-gpus="$gpus" \
    --disable-usage-stats --block "$@"
}

role_worker() {
  ray_head
  ray_auth
  secret_files
  wait_for_ray_head
  local head="$HOST:$PORT"
  [[ $HOST == *:* ]] && head="[$HOST]:$PORT"
  wait_for_storage # trials write checkpoints there
  # Ray's idle workers load the trainer before trials ask for them (studyrunner/orchestrate/cluster/warm_workers.py).
  if [[ ${STUDYRUNNER_WARM_WORKERS:-1} != 0 ]]; then
    export RAY_preload_python_modules=${RAY_preload_python_modules:-studyrunner.orchestrate.cluster.trainable,torch._dynamo}
    export RAY_idle_worker_killing_time_threshold_ms=${RAY_idle_worker_killing_time_threshold_ms:-60000}
  fi
  run ray start --address="$head" --disable-usage-stats --block "$@"
}

role_mlflow() {
  need MLFLOW_BACKEND_STORE_URI "the tracking server's database, e.g. postgresql+psycopg://mlflow@postgres:5432/mlflow" \
    "with the password in PGPASSFILE"
  need MLFLOW_ARTIFACTS_DESTINATION "where the server keeps proxied artifacts, e.g. s3://studyrunner/mlflow-artifacts"
  local port=${STUDYRUNNER_MLFLOW_PORT:-5000} var
  is_count "$port" || die "$EX_CONFIG" "STUDYRUNNER_MLFLOW_PORT=${port@Q} is not a port number"
  secret_files
  wait_for_url MLFLOW_BACKEND_STORE_URI "the tracking database"
  if [[ $MLFLOW_ARTIFACTS_DESTINATION == s3://* ]]; then
    for var in MLFLOW_S3_ENDPOINT_URL AWS_ENDPOINT_URL_S3 AWS_ENDPOINT_URL; do
      [[ -n ${!var:-} ]] && { wait_for_url "$var" "the object store" && break; }
    done
  fi
  # One worker and no job-execution workers: ~0.5 GB instead of ~2.6 GB, ready in seconds (docs/guide/mlflow.md).
  export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}
  # The store and the destination stay in the environment, where `mlflow server` reads them
  # (MLFLOW_BACKEND_STORE_URI, MLFLOW_ARTIFACTS_DESTINATION): a URL with a password would show in `ps`.
  run mlflow server --serve-artifacts --host 0.0.0.0 --port "$port" --workers 1 "$@"
}

role_submit() {
  [[ $# -gt 0 ]] || die "$EX_USAGE" "submit: name a study file (submit studies/quickstart.yaml)" \
    "or a studyrunner command (submit status quickstart)"
  [[ $1 == *.yaml || $1 == *.yml ]] && set -- submit "$@"
  local trains="" join=${STUDYRUNNER_JOIN_RAY:-auto}
  case $1 in submit | resume | rerun) trains=1 ;; esac
  if [[ -n $trains ]]; then # the cluster route: every location must be one that all containers can reach
    need STUDYRUNNER_DB "the ledger's SQLAlchemy URL, e.g. postgresql+psycopg://studyrunner@postgres:5432/studyrunner" \
      "with the password in PGPASSFILE"
    need MLFLOW_TRACKING_URI "the MLflow server, e.g. http://mlflow:5000"
    need STUDYRUNNER_STORAGE "a URI every node can reach, e.g. s3://studyrunner/workspace"
  fi
  secret_files
  wait_for_url STUDYRUNNER_DB "the ledger database"
  [[ ${MLFLOW_TRACKING_URI:-} == http* ]] && wait_for_url MLFLOW_TRACKING_URI "the MLflow server"
  wait_for_storage
  if [[ -n $trains && ${RAY_ADDRESS:-} == auto ]]; then
    join=no # the Ray on this machine, found by Ray itself
  elif [[ -n $trains ]]; then
    ray_head
    ray_auth
    wait_for_ray_head
    case $join in
      auto) [[ -z ${RAY_JOB_CONFIG_JSON_ENV_VAR:-} ]] && ! raylet_here && join=yes ;;
      yes | no) ;;
      *) die "$EX_CONFIG" "STUDYRUNNER_JOIN_RAY=${join@Q} is not auto, yes or no" ;;
    esac
    if [[ $join == yes ]]; then
      local head="$HOST:$PORT" log=/tmp/studyrunner-ray-join.log
      [[ $HOST == *:* ]] && head="[$HOST]:$PORT"
      local join_cmd=(ray start --address="$head" --num-cpus=0 --num-gpus=0 --disable-usage-stats)
      if [[ ${STUDYRUNNER_ENTRYPOINT_DRY_RUN:-} == 1 ]]; then
        echo "${join_cmd[*]@Q}"
      elif ! "${join_cmd[@]}" >"$log" 2>&1; then
        die "$EX_UNAVAILABLE" "could not join the Ray cluster at $head as a driver node: $(grep -m1 -iE 'error|exception' "$log" || tail -n1 "$log")"
      fi
    fi
  fi
  run studyrunner "$@"
}

random_secret() { # 32 random bytes as 64 hex digits: safe in a URL, an INI file and a .pgpass line
  od -An -v -tx1 -N32 /dev/urandom | tr -d " \n"
}

role_secrets() { # secrets [DIR]: the cluster's secrets, made on the first start and kept after (0600, uid 1000)
  local dir=${1:-/secrets} owner=${STUDYRUNNER_SECRETS_OWNER:-1000:1000} name pg s3_user pw_pg pw_s3
  local pg_user=${POSTGRES_USER:-studyrunner} pg_host=${STUDYRUNNER_PGPASS_HOST:-postgres:5432}
  s3_user=${MINIO_ROOT_USER:-studyrunner}
  [[ $owner =~ ^[0-9]+:[0-9]+$ ]] || die "$EX_CONFIG" "STUDYRUNNER_SECRETS_OWNER=${owner@Q} is not uid:gid"
  umask 077
  mkdir -p "$dir" || die "$EX_CONFIG" "secrets: cannot make the folder $dir"
  # The secrets themselves: made once; one you put there before the first start is kept.
  for name in ray-auth-token postgres-password minio-root-password; do
    if [[ ! -s $dir/$name ]]; then
      { random_secret >"$dir/$name.new" && mv "$dir/$name.new" "$dir/$name"; } ||
        die "$EX_CONFIG" "secrets: cannot write $dir/$name"
      echo "entrypoint: secrets: made $dir/$name"
    fi
  done
  pw_pg=$(<"$dir/postgres-password")
  pw_s3=$(<"$dir/minio-root-password")
  # The files the clients read, made from them each time: libpq's password file (\ and : escaped) and
  # the AWS SDKs' shared credentials file.
  pg=${pw_pg//\\/\\\\}
  pg=${pg//:/\\:}
  printf '%s:*:%s:%s\n' "$pg_host" "$pg_user" "$pg" >"$dir/pgpass.new"
  printf '[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n' "$s3_user" "$pw_s3" >"$dir/aws-credentials.new"
  { mv "$dir/pgpass.new" "$dir/pgpass" && mv "$dir/aws-credentials.new" "$dir/aws-credentials"; } ||
    die "$EX_CONFIG" "secrets: cannot write the client files in $dir"
  { chmod 0700 "$dir" && chmod 0600 "$dir"/*; } || die "$EX_CONFIG" "secrets: cannot set the modes in $dir"
  if [[ $(id -u) == 0 ]]; then # the images' user reads them; libpq wants its file 0600 and theirs
    chown "$owner" "$dir" "$dir"/* || die "$EX_CONFIG" "secrets: cannot give $dir to $owner"
  fi
}

health() {
  local role=${1:-${STUDYRUNNER_ROLE:-}} port
  export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token} # as the role itself: `ray health-check` needs the token too
  case $role in
    head)
      port=${STUDYRUNNER_RAY_PORT:-6379}
      reachable 127.0.0.1 "$port" || die 1 "health: the Ray head's GCS is not listening on port $port"
      raylet_here || die 1 "health: no raylet runs in this container"
      ray health-check --address "127.0.0.1:$port" >/dev/null 2>&1 || die 1 "health: ray health-check failed on port $port"
      ;;
    worker)
      raylet_here || die 1 "health: no raylet runs in this container"
      ray_endpoint "${RAY_ADDRESS:-}" || die "$EX_CONFIG" "health: RAY_ADDRESS ('${RAY_ADDRESS:-}') is not host:port"
      reachable "$HOST" "$PORT" || die 1 "health: the Ray head at $HOST:$PORT is not reachable"
      ;;
    mlflow)
      port=${STUDYRUNNER_MLFLOW_PORT:-5000}
      python3 - "$port" 2>/dev/null <<'PY' || die 1 "health: MLflow does not answer on http://127.0.0.1:$port/health"
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=5).close()
PY
      ;;
    *) die "$EX_USAGE" "health: name the role to check: head, worker or mlflow" ;;
  esac
}

if [[ $# -gt 0 && $1 =~ ^($ROLES)$ ]]; then
  role=$1
  shift
elif [[ $# -gt 0 ]]; then
  exec "$@"
else
  role=${STUDYRUNNER_ROLE:-}
  [[ $role =~ ^($ROLES)$ ]] || die "$EX_USAGE" "no role: give head, worker, mlflow, submit or secrets" \
    "(as the first argument or STUDYRUNNER_ROLE${role:+; got ${role@Q}})"
fi

case $role in
  head) role_head "$@" ;;
  worker) role_worker "$@" ;;
  mlflow) role_mlflow "$@" ;;
  submit) role_submit "$@" ;;
  health) health "$@" ;;
  secrets) role_secrets "$@" ;;
esac
