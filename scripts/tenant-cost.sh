#!/usr/bin/env bash
# Measures what a user's own kernel costs (--kernel-isolation user): the first turn of a new user
# (their kernel started for it), a turn of theirs once it runs, and each kernel's memory after a
# turn (RSS and PSS). The kernel answers a scripted two-chunk LLM on 127.0.0.1; three users.
#   bash scripts/tenant-cost.sh [GATEWAY_BINARY]
# As root, kernels run as nobody (65534) from the venv other users can read (see scripts/test.sh);
# otherwise as the caller, from the cached venv.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
gw=${1:-${CARGO_TARGET_DIR:-$HOME/.cache/iac-code-agui/target}/release/iac-code-agui}
work=$(mktemp -d)
chmod 711 "$work"
mkdir -p "$work/state" "$work/ws"
chmod 711 "$work/state" "$work/ws"
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
IAC_CODE_AGUI_AUTH_TOKEN=tok IAC_CODE_PROVIDER="OpenAI Compatible" \
  IAC_CODE_BASE_URL=http://127.0.0.1:$llm_port/v1 IAC_CODE_API_KEY=k IAC_CODE_MODEL=m \
  IAC_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 IAC_CODE_AGUI_ALLOWED_CWDS="$work/ws" \
  NO_PROXY=127.0.0.1 "$gw" --port $gw_port --a2a-command "$bin/iac-code" --kernel-isolation user \
  --kernels 3 --state-dir "$work/state" "${extra[@]}" > "$work/gateway.log" 2>&1 &
gateway=$!
trap 'kill $gateway $llm 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
sleep 1
turn() { # user thread
  local key
  key=u$(printf '%s' "$1" | sha256sum | cut -c1-32)
  curl -s -N -X POST "http://127.0.0.1:$gw_port/" -H "authorization: Bearer tok" \
    -H "x-iac-code-user: $1" -H 'content-type: application/json' -H 'accept: text/event-stream' \
    -d "{\"threadId\":\"$2\",\"runId\":\"r-$2\",\"state\":{},\"messages\":[{\"id\":\"m1\",\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[],\"context\":[],\"forwardedProps\":{\"iacCode\":{\"schemaVersion\":1,\"rosInvocationId\":\"i\",\"cwd\":\"$work/ws/$key/p\"}}}" |
    grep -o '"type":"RUN_[A-Z]*"' | tail -1
}
for u in alice bob carol; do
  t0=$(date +%s.%N); a=$(turn $u $u-1); t1=$(date +%s.%N); b=$(turn $u $u-2); t2=$(date +%s.%N)
  printf '%s: first turn %.2f s (%s), a turn on their running kernel %.2f s (%s)\n' \
    $u "$(echo "$t1 - $t0" | bc)" "$a" "$(echo "$t2 - $t1" | bc)" "$b"
done
for p in $(pgrep -f "iac-code a2a" -P "$gateway"); do
  printf 'kernel %s: RSS %s KiB, PSS %s KiB\n' "$p" \
    "$(awk '/^VmRSS/{print $2}' /proc/$p/status)" "$(awk '/^Pss:/{print $2}' /proc/$p/smaps_rollup)"
done
