#!/usr/bin/env bash
# Measures what a user's own kernel costs (--kernel-isolation user), with --kernel-start fork and
# --kernel-start spawn in one run. Through the gateway: a new user's first turn (their kernel
# started for it) against a turn of theirs once it runs, each kernel's memory once idle after
# its two turns, and how many such kernels fit in 24 GiB (the kernel answers a scripted
# two-chunk LLM on 127.0.0.1). Then, by the kernel crate's `kernel_idle` example: each kernel
# started with the same directories, confinement and uid until its /health answers, and its
# memory idle before any turn.
#   bash scripts/kernel-density.sh [GATEWAY_BINARY] [USERS]
# USERS: users per mode (default 6). As root, kernels run as nobody (65534) from the venv other
# users can read (see scripts/test.sh); otherwise as the caller, from the cached venv.
#
# Memory: a kernel's own memory is what no other process shares (USS: Private_Clean +
# Private_Dirty of /proc/PID/smaps_rollup); PSS is shown beside it. Users in 24 GiB: (24 GiB -
# the gateway's and the fork server's RSS) / the median kernel's USS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/iac-code-agui/target}
gw=${1:-$CARGO_TARGET_DIR/release/iac-code-agui}
users=${2:-6}
work=$(mktemp -d)
chmod 711 "$work"
extra=()
if [ "$(id -u)" -eq 0 ]; then
  bin=$(IAC_CODE_AGUI_CACHE=/var/cache/iac-code-agui PYTHON=/usr/bin/python3 bash scripts/kernel-venv.sh)
  extra=(--kernel-user 65534)
else
  bin=$(bash scripts/kernel-venv.sh)
fi
llm_port=18555
gw_port=18556
cat > "$work/llm.py" <<'PY'
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get('content-length', 0)))
        self.send_response(200)
        self.send_header('content-type', 'text/event-stream')
        self.end_headers()
        def chunk(delta, finish=None):
            c = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
        for t in ["Hello", " there."]:
            chunk({"role": "assistant", "content": t})
        chunk({}, "stop")
        self.wfile.write(b"data: [DONE]\n\n")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
python3 "$work/llm.py" $llm_port &
llm=$!
gateway=
trap 'kill $gateway $llm 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT

turn() { # user thread: the run's last event type
  local key
  key=u$(printf '%s' "$1" | sha256sum | cut -c1-32)
  curl -s -N -X POST "http://127.0.0.1:$gw_port/" -H "authorization: Bearer tok" \
    -H "x-iac-code-user: $1" -H 'content-type: application/json' -H 'accept: text/event-stream' \
    -d "{\"threadId\":\"$2\",\"runId\":\"r-$2\",\"state\":{},\"messages\":[{\"id\":\"m1\",\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[],\"context\":[],\"forwardedProps\":{\"iacCode\":{\"schemaVersion\":1,\"rosInvocationId\":\"i\",\"cwd\":\"$work/ws/$key/p\"}}}" |
    grep -o '"type":"RUN_[A-Z]*"' | tail -1
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
health() { curl -s -H "authorization: Bearer tok" "http://127.0.0.1:$gw_port/health"; }
kib() { awk -v f="$2" '$1 == f":" {s += $2} END {print s + 0}' "/proc/$1/smaps_rollup"; }

echo "| start | new user's first turn − a turn on their running kernel (median) | first turn / running turn (medians) | kernel memory idle after its two turns: USS / PSS (median) | such kernels in 24 GiB |"
echo "| --- | --- | --- | --- | --- |"
for mode in fork spawn; do
  rm -rf "$work/state" "$work/ws"
  mkdir -p "$work/state" "$work/ws"
  chmod 711 "$work/state" "$work/ws"
  IAC_CODE_AGUI_AUTH_TOKEN=tok IAC_CODE_PROVIDER="OpenAI Compatible" \
    IAC_CODE_BASE_URL=http://127.0.0.1:$llm_port/v1 IAC_CODE_API_KEY=k IAC_CODE_MODEL=m \
    IAC_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 IAC_CODE_AGUI_ALLOWED_CWDS="$work/ws" \
    NO_PROXY=127.0.0.1 "$gw" --port $gw_port --a2a-command "$bin/iac-code" --kernel-isolation user \
    --kernel-start $mode --kernels "$users" --state-dir "$work/state" "${extra[@]}" \
    > "$work/gateway-$mode.log" 2>&1 &
  gateway=$!
  for _ in $(seq 600); do
    h=$(health || true)
    if [ $mode = spawn ] && [ -n "$h" ]; then break; fi
    if printf '%s' "$h" | grep -q '"forkServer":{[^}]*"state":"ready"'; then break; fi
    sleep 0.2
  done
  : > "$work/first" ; : > "$work/warm"
  for i in $(seq "$users"); do
    u=user$i
    t0=$(date +%s.%N); a=$(turn $u $u-1); t1=$(date +%s.%N); b=$(turn $u $u-2); t2=$(date +%s.%N)
    [ "$a" = '"type":"RUN_FINISHED"' ] && [ "$b" = '"type":"RUN_FINISHED"' ] ||
      { echo "$mode $u: a turn failed ($a, $b)" >&2; cat "$work/gateway-$mode.log" >&2; exit 1; }
    echo "$t1 - $t0" | bc >> "$work/first"
    echo "$t2 - $t1" | bc >> "$work/warm"
  done
  sleep 2
  zygote=$(pgrep -f iac-code-agui-zygote -P "$gateway" || true)
  if [ $mode = fork ]; then kernels=$(pgrep -P "$zygote"); else kernels=$(pgrep -f "iac-code a2a" -P "$gateway"); fi
  : > "$work/uss" ; : > "$work/pss"
  for p in $kernels; do
    echo $(( $(kib "$p" Private_Clean) + $(kib "$p" Private_Dirty) )) >> "$work/uss"
    kib "$p" Pss >> "$work/pss"
  done
  [ "$(wc -l < "$work/uss")" -eq "$users" ] || { echo "$mode: $(wc -l < "$work/uss") kernels, not $users" >&2; exit 1; }
  base=$(awk '/^VmRSS/{print $2}' "/proc/$gateway/status")
  [ -n "$zygote" ] && base=$(( base + $(awk '/^VmRSS/{print $2}' "/proc/$zygote/status") ))
  first=$(median < "$work/first"); warm=$(median < "$work/warm")
  uss=$(median < "$work/uss"); pss=$(median < "$work/pss")
  fit=$(( (24 * 1024 * 1024 - base) / ${uss%.*} ))
  printf '| %s | %.0f ms | %.2f s / %.2f s | %.1f MiB / %.1f MiB | %d |\n' $mode \
    "$(echo "($first - $warm) * 1000" | bc)" "$first" "$warm" \
    "$(echo "$uss / 1024" | bc -l)" "$(echo "$pss / 1024" | bc -l)" "$fit"
  kill $gateway; wait $gateway 2>/dev/null || true
  gateway=
done
echo "($users users per mode; gateway $("$gw" --version 2>/dev/null | head -1); $(nproc) cores)"
echo
echo "| start | start to /health (median) | kernel memory idle, no turn yet: USS / PSS (median) | idle kernels in 24 GiB |"
echo "| --- | --- | --- | --- |"
cargo build -q --release -p kernel --example kernel_idle
idle=$CARGO_TARGET_DIR/release/examples/kernel_idle
if [ "$(id -u)" -eq 0 ]; then "$idle" "$bin/iac-code" "$users" 65534; else "$idle" "$bin/iac-code" "$users"; fi
