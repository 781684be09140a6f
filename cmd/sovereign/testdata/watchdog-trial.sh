#!/bin/bash
# watchdog-trial.sh: two replicas of `sovereign run --ttl 2s` on a real
# redis-server; the leader's sovereign process alone is stopped (SIGSTOP) for
# 5 s. Each replica's command appends "ID TIMESTAMP" to a log every 20 ms.
# Prints, per trial, when the paused holder's command last wrote and when the
# successor's first wrote (seconds after the stop), their overlap, the paused
# sovereign's exit status (79: lost) and its watchdog's resident memory.
#
#   cd cmd/sovereign && go build -o /tmp/sovereign . && testdata/watchdog-trial.sh /tmp/sovereign 3
set -u
SOV=${1:?path to a sovereign binary}
TRIALS=${2:-3}
DIR=$(mktemp -d)
trap 'redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1; rm -rf "$DIR"' EXIT
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --dir "$DIR" >/dev/null
sleep 0.3
cat > "$DIR/job.sh" <<JOB
#!/bin/sh
while :; do echo "\$SOVEREIGN_HOLDER_ID \$(date +%s.%N)" >> "$DIR/beats.log"; sleep 0.02; done
JOB
chmod +x "$DIR/job.sh"
export SOVEREIGN_BACKEND=redis://127.0.0.1:$PORT
for i in $(seq "$TRIALS"); do
	rm -f "$DIR/beats.log"
	"$SOV" run --ttl 2s --id a "job$i" -- "$DIR/job.sh" 2>"$DIR/a.log" & A=$!
	sleep 1
	"$SOV" run --ttl 2s --id b "job$i" -- "$DIR/job.sh" 2>"$DIR/b.log" & B=$!
	sleep 1
	WD=$(pgrep -P "$A" -f 'sovereign-watchdog' | head -1)
	RSS=$(awk '/VmRSS/ {print $2 " kB"}' "/proc/$WD/status" 2>/dev/null)
	STOP=$(date +%s.%N)
	kill -STOP "$A"; sleep 5; kill -CONT "$A"
	wait "$A"; CODE=$?
	sleep 1; kill -TERM "$B"; wait "$B"
	awk -v stop="$STOP" -v code="$CODE" -v rss="$RSS" '
		$1 == "a" { la = $2 } $1 == "b" && !fb { fb = $2 }
		END { ov = la - fb; if (ov < 0) ov = 0
			printf "trial: a last %+.3f s, b first %+.3f s after the stop; overlap %.3f s; a exited %d; watchdog %s\n",
				la - stop, fb - stop, ov, code, rss }' "$DIR/beats.log"
done
