#!/bin/bash
# alert-trial.sh: three replicas of testdata/alerttrial (an elector with the
# default options, TTL 10 s, exporting contrib/prometheus's metrics) on a real
# redis-server, scraped by a real Prometheus (scrape and evaluation every 1 s)
# loaded with ../alerts.yaml as shipped. It injects four faults in turn and
# prints, in seconds since the start, every change of the replicas'
# sovereign_is_leader and of the alerts (pending or firing), read from
# Prometheus's HTTP API:
#   1. the leader is killed (SIGKILL), and restarted 20 s later;
#   2. the leader is paused (SIGSTOP) for 15 s, then continued;
#   3. redis-server is paused for 75 s, then continued;
#   4. every replica is stopped (SIGTERM).
# Needs go, redis-server, prometheus (apt-get install -y --no-install-recommends
# prometheus), curl and python3; takes about 4 minutes.
#
#   cd contrib/prometheus && testdata/alert-trial.sh
set -u
for tool in go redis-server prometheus curl python3; do
	command -v "$tool" >/dev/null || { echo "alert-trial.sh: $tool not found" >&2; exit 1; }
done
cd "$(dirname "$0")/.." || exit 1
DIR=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
	[ -n "${REDIS:-}" ] && kill -CONT "$REDIS" 2>/dev/null && kill -KILL "$REDIS" 2>/dev/null
	[ -n "${PROM:-}" ] && kill -TERM "$PROM" 2>/dev/null && wait "$PROM" 2>/dev/null
	[ -n "${POLL:-}" ] && kill -TERM "$POLL" 2>/dev/null
	rm -rf "$DIR"
}
trap cleanup EXIT
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

go build -o "$DIR/alerttrial" ./testdata/alerttrial || exit 1
RPORT=$(freeport); PPORT=$(freeport)
PORTS=("$(freeport)" "$(freeport)" "$(freeport)")
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" >"$DIR/redis.log" 2>&1 & REDIS=$!
cat >"$DIR/prometheus.yml" <<CONF
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: ["$PWD/alerts.yaml"]
scrape_configs:
  - job_name: trial
    static_configs: [{targets: ["127.0.0.1:${PORTS[0]}", "127.0.0.1:${PORTS[1]}", "127.0.0.1:${PORTS[2]}"]}]
CONF
prometheus --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/tsdb" \
	--web.listen-address="127.0.0.1:$PPORT" >"$DIR/prometheus.log" 2>&1 & PROM=$!
start() { # start REPLICA-INDEX
	"$DIR/alerttrial" -id "r$1" -http "127.0.0.1:${PORTS[$1]}" -redis "127.0.0.1:$RPORT" 2>>"$DIR/r$1.log" &
	PIDS[$1]=$!
}
start 0; start 1; start 2
leader() { # prints the index of the replica whose is_leader is 1
	for i in 0 1 2; do
		curl -s "127.0.0.1:${PORTS[$i]}/metrics" | grep -q '^sovereign_is_leader{election="trial"} 1' && { echo "$i"; return; }
	done
	return 1
}
export T0=$(date +%s.%N)
say() { awk -v now="$(date +%s.%N)" -v t0="$T0" -v msg="$*" 'BEGIN { printf "%7.1f  *** %s\n", now - t0, msg }'; }

# The poller: one line per change of is_leader by replica or of the alerts.
python3 - "$PPORT" "${PORTS[@]}" <<'PY' & POLL=$!
import json, os, sys, time, urllib.parse, urllib.request
prom, ports = sys.argv[1], sys.argv[2:]
names = {"127.0.0.1:" + p: "r%d" % i for i, p in enumerate(ports)}
t0 = float(os.environ["T0"])
def get(path):
    with urllib.request.urlopen("http://127.0.0.1:%s%s" % (prom, path), timeout=2) as r:
        return json.load(r)["data"]
last = None
while True:
    try:
        lead = {names[r["metric"]["instance"]]: r["value"][1]
                for r in get("/api/v1/query?query=" + urllib.parse.quote("sovereign_is_leader"))["result"]}
        alerts = sorted("%s[%s]%s" % (a["labels"]["alertname"].removeprefix("Sovereign"), a["state"],
                                     "(%s)" % a["labels"]["reason"] if "reason" in a["labels"] else "")
                        for a in get("/api/v1/alerts")["alerts"])
        cur = "is_leader %-22s alerts %s" % (" ".join("%s=%s" % (n, lead.get(n, "-")) for n in sorted(names.values())),
                                               " ".join(alerts) or "none")
    except Exception as e:
        cur = "prometheus: %s" % e
    if cur != last:
        print("%7.1f  %s" % (time.time() - t0, cur), flush=True)
        last = cur
    time.sleep(0.25)
PY

for _ in $(seq 60); do L=$(leader) && break; sleep 0.5; done
[ -n "${L:-}" ] || { echo "no leader after 30 s" >&2; exit 1; }
sleep 8 # Prometheus has scraped every replica a few times

say "1. kill -9 the leader r$L"
kill -KILL "${PIDS[$L]}"; wait "${PIDS[$L]}" 2>/dev/null
sleep 20
say "   r$L restarted"; start "$L"
sleep 10

L=$(leader) || { echo "no leader" >&2; exit 1; }
say "2. SIGSTOP the leader r$L for 15 s"
kill -STOP "${PIDS[$L]}"; sleep 15; kill -CONT "${PIDS[$L]}"
say "   r$L continued"
sleep 15

say "3. SIGSTOP redis-server for 75 s"
kill -STOP "$REDIS"; sleep 75; kill -CONT "$REDIS"
say "   redis-server continued"
sleep 25

say "4. SIGTERM every replica"
for i in 0 1 2; do kill -TERM "${PIDS[$i]}"; done
for i in 0 1 2; do wait "${PIDS[$i]}" 2>/dev/null; done
sleep 70
say "end"
