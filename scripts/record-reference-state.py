#!/usr/bin/env python3
"""Records the thread-state fixtures of crates/gateway/tests/data/reference-state/.

The Python adapter this gateway replaces (`iac-code agui`, iac-code 0.16.0 with a2a-sdk 1.1.5)
runs in front of the real kernel (`iac-code a2a`), which talks to a scripted fake
OpenAI-compatible LLM served by this script. Everything binds 127.0.0.1 and uses a temporary
HOME, workspace root and state directory, so nothing leaves the machine and nothing global is
touched. Each scenario is driven over AG-UI HTTP/SSE; after each moment the adapter's thread file
(`<state-dir>/threads/<threadId>.json`) is copied to `<out>/<scenario>_<moment>.<threadId>.json`,
byte for byte but for the workspace root in `cwd` (see --cwd-root).

Run it through scripts/record-reference-state.sh, which finds the pinned kernel venv (this file
needs only the standard library; the venv's python runs it). Options:

  --bin DIR        the venv's bin directory (iac-code)
  --out DIR        where the fixtures go; files named like fixtures there are replaced
  --requests FILE  also write every run request sent, one JSON object a line
                   ({"threadId", "runId", "status", "raw": the body as sent}), so the run
                   digests the adapter records can be recomputed from them
  --only S03,S10   a subset of the scenarios (S07 brings S01 along: it continues thread-s1)
  --cwd-root ROOT  the workspace root the copies name in `cwd` (default /srv/agui-ref/ws, the one
                   the fixtures name; an empty ROOT keeps the temporary one the adapter used).
                   Only that root is rewritten: the run digests stay the adapter's, over
                   the requests it got (whose `cwd` is the temporary one)
  --keep-work      keep the temporary directory (logs of the three servers) and print its path

The fake LLM picks its reply from the marker `scenario:<name>` in the latest user message that has
one, and answers a conversation that ends with a tool result with a text quoting it. The texts,
tool calls and chunking are those the fixtures were first recorded with: the adapter stores
SHA-256 digests of streamed text, so they must not change. Only the pace of the `slow` reply
differs: it stops after its third chunk until the harness has taken the moment the scenario is
about (cancel, disconnect), then streams the rest quickly, so the recording does not depend on
timing and takes well under a minute.
"""

from __future__ import annotations

import argparse
import ctypes
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

FIXTURE_NAME = re.compile(r"^S\d+[a-z]?_.+\.json$")
A2A_TOKEN = "reference-state-a2a-token"
# The workspace root the fixtures name in `cwd`.
FIXTURE_WORKSPACE = "/srv/agui-ref/ws"


class HarnessError(Exception):
    """A scenario did not go the way the fixtures were recorded."""


def log(msg: str) -> None:
    print(f"[record-reference-state] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# The scripted fake LLM (OpenAI-compatible Chat Completions, streaming)
# ------------------------------------------------------------------------------------------------

SLOW_CHUNKS = 60
SLOW_HELD_AFTER = 3
SLOW_PACE = 0.1
TEXT_PACE = 0.02
REASONING_PACE = 0.02
USAGE = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}

ASK_ARGUMENTS = {
    "question": "Which cloud target should be used?",
    "options": [
        {"id": "alibaba", "label": "Alibaba Cloud"},
        {"id": "none", "label": "Not a deployment request"},
    ],
    "allow_free_text": True,
}
CONCLUSION_ARGUMENTS = {
    "conclusion": {
        "is_infra_intent": False,
        "category": "chat",
        "confidence": "high",
        "rejection_reason": "The user confirmed this is not a deployment request.",
        "user_message_summary": "greeting",
        "clarification_choice": "none",
    }
}


@dataclass
class Reply:
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tools: list[tuple[str, dict]] = field(default_factory=list)
    pace: float = TEXT_PACE
    slow: bool = False
    error: bool = False


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _marker(messages: list[dict]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            found = re.search(r"scenario:([a-z0-9_]+)", _text_of(m.get("content")))
            if found:
                return found.group(1)
    return "default"


def _calls(messages: list[dict]) -> list[dict]:
    return [c for m in messages for c in (m.get("tool_calls") or [])]


def plan_reply(body: dict) -> Reply:
    messages = body.get("messages") or []
    offered = [(t.get("function") or {}).get("name") for t in body.get("tools") or []]
    marker = _marker(messages)
    last = messages[-1] if messages else {}
    tool_result = last if last.get("role") == "tool" else None

    if marker == "pipeline" or "complete_step" in offered:
        # The intent step of the selling pipeline: one question, then the step's conclusion
        # (not an infrastructure request, so the pipeline exits early).
        called = [(c.get("function") or {}).get("name") for c in _calls(messages)]
        answered = None
        if tool_result is not None:
            for c in _calls(messages):
                if c.get("id") == tool_result.get("tool_call_id"):
                    answered = (c.get("function") or {}).get("name")
        if "ask_user_question" in offered and "ask_user_question" not in called:
            return Reply(text=["I need one clarification."], tools=[("ask_user_question", ASK_ARGUMENTS)])
        if "complete_step" in offered and answered != "complete_step":
            return Reply(text=["Concluding the step."], tools=[("complete_step", CONCLUSION_ARGUMENTS)])
        return Reply(text=["Pipeline step finished."])

    if marker == "error":
        return Reply(error=True)
    if tool_result is not None:
        result = _text_of(tool_result.get("content")).strip()[:200]
        return Reply(text=["Done. ", "The tool returned: ", result])
    if marker == "text":
        return Reply(text=["Hello", " from the", " fake LLM."])
    if marker == "think":
        return Reply(reasoning=["Let me think", " about this", " carefully."], text=["After thinking:", " 42."])
    if marker == "bash":
        return Reply(text=["I will run a command."],
                     tools=[("bash", {"command": "echo agui-ref > out.txt && cat out.txt"})])
    if marker == "bash2":
        return Reply(text=["I will run two commands."],
                     tools=[("bash", {"command": "echo first > first.txt"}),
                            ("bash", {"command": "echo second > second.txt"})])
    if marker == "write":
        return Reply(text=["I will write a file."],
                     tools=[("write_file", {"path": "note.txt", "content": "hello\n"})])
    if marker == "slow":
        return Reply(text=[f"tick{i} " for i in range(SLOW_CHUNKS)], pace=SLOW_PACE, slow=True)
    return Reply(text=["OK."])


class FakeLlm:
    """Serves /v1 on a free loopback port from a thread of this process."""

    def __init__(self) -> None:
        self.slow_gate = threading.Event()
        self.slow_gate.set()
        self.requests = 0
        llm = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._json(404, {"error": "not found"})
                    return
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    self._json(400, {"error": "bad json"})
                    return
                llm.requests += 1
                reply = plan_reply(body)
                if reply.error:
                    self._json(400, {"error": {"message": "fake llm rejected the request",
                                               "type": "invalid_request_error", "code": "fake_error"}})
                elif body.get("stream"):
                    self._stream(body.get("model", "fake-model"), reply)
                else:
                    self._complete(body.get("model", "fake-model"), reply)

            def _json(self, status: int, doc: Any) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, model: str, reply: Reply) -> None:
                cid = "chatcmpl-" + uuid.uuid4().hex[:20]

                def chunk(delta: dict | None, finish: str | None = None, usage: dict | None = None) -> None:
                    doc: dict[str, Any] = {
                        "id": cid,
                        "object": "chat.completion.chunk",
                        "created": int(time.time()),
                        "model": model,
                        "choices": [] if delta is None
                        else [{"index": 0, "delta": delta, "finish_reason": finish}],
                    }
                    if usage is not None:
                        doc["usage"] = usage
                    self.wfile.write(b"data: " + json.dumps(doc).encode() + b"\n\n")
                    self.wfile.flush()

                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                try:
                    chunk({"role": "assistant", "content": ""})
                    for piece in reply.reasoning:
                        time.sleep(REASONING_PACE)
                        chunk({"reasoning_content": piece})
                    for i, piece in enumerate(reply.text):
                        if reply.slow and i == SLOW_HELD_AFTER:
                            llm.slow_gate.wait(timeout=120)
                        time.sleep(reply.pace)
                        chunk({"content": piece})
                    for index, (name, arguments) in enumerate(reply.tools):
                        call_id = "call_" + uuid.uuid4().hex[:12]
                        chunk({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                               "function": {"name": name, "arguments": ""}}]})
                        encoded = json.dumps(arguments)
                        half = len(encoded) // 2
                        for part in (encoded[:half], encoded[half:]):
                            chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
                    chunk({}, finish="tool_calls" if reply.tools else "stop")
                    chunk(None, usage=USAGE)
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _complete(self, model: str, reply: Reply) -> None:
                message: dict[str, Any] = {"role": "assistant", "content": "".join(reply.text) or "OK."}
                if reply.reasoning:
                    message["reasoning_content"] = "".join(reply.reasoning)
                if reply.tools:
                    message["tool_calls"] = [
                        {"id": "call_" + uuid.uuid4().hex[:12], "type": "function",
                         "function": {"name": name, "arguments": json.dumps(arguments)}}
                        for name, arguments in reply.tools
                    ]
                self._json(200, {
                    "id": "chatcmpl-" + uuid.uuid4().hex[:20],
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [{"index": 0, "message": message,
                                 "finish_reason": "tool_calls" if reply.tools else "stop"}],
                    "usage": USAGE,
                })

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def hold_slow(self) -> None:
        """The next `slow` reply stops after its third chunk until `release_slow`."""
        self.slow_gate.clear()

    def release_slow(self) -> None:
        self.slow_gate.set()

    def close(self) -> None:
        self.release_slow()
        self.server.shutdown()
        self.server.server_close()


# ------------------------------------------------------------------------------------------------
# The kernel and the adapter
# ------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_setup() -> None:
    # Its own process group (stopped as a whole), and killed if this script dies.
    os.setsid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class Process:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], logs: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = logs / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, preexec_fn=_child_setup)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
        if self.proc is None:
            return
        pid = self.proc.pid
        if self.proc.poll() is None:
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        # Whatever is left of its group (tool subprocesses, a child that ignored the signal).
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def http_get(port: int, path: str, headers: dict[str, str] | None = None, timeout: float = 2.0) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def wait_healthy(proc: Process, port: int, headers: dict[str, str] | None = None,
                 limit: float = 120.0) -> float:
    t0 = time.monotonic()
    while True:
        try:
            if http_get(port, "/health", headers) == 200:
                return time.monotonic() - t0
        except OSError:
            pass
        if not proc.alive():
            raise HarnessError(f"{proc.name} exited before it was healthy:\n{proc.tail()}")
        if time.monotonic() - t0 > limit:
            raise HarnessError(f"{proc.name} not healthy after {limit:.0f} s:\n{proc.tail()}")
        time.sleep(0.1)


class Stack:
    """Fake LLM, `iac-code a2a` and `iac-code agui --a2a-url … --state-dir …` in one work dir."""

    def __init__(self, bin_dir: Path, work: Path) -> None:
        self.work = work
        home = work / "home"
        (home / ".iac-code").mkdir(parents=True)
        (work / "ws").mkdir()
        (work / "state").mkdir()
        logs = work / "logs"
        logs.mkdir()
        self.ws = (work / "ws").resolve()
        self.state = work / "state"
        self.llm = FakeLlm()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("IAC_CODE_", "IACCODE_")) and k.lower() not in
               {"http_proxy", "https_proxy", "all_proxy", "no_proxy", "disable_telemetry"}}
        env.update({
            "HOME": str(home),
            "IAC_CODE_CONFIG_DIR": str(home / ".iac-code"),
            "IAC_CODE_PROVIDER": "OpenAI Compatible",
            "IAC_CODE_BASE_URL": f"http://127.0.0.1:{self.llm.port}/v1",
            "IAC_CODE_API_KEY": "fake-key",
            "IAC_CODE_MODEL": "fake-model",
            "IAC_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "IAC_CODE_AGUI_ALLOWED_CWDS": str(self.ws),
            "IACCODE_A2A_ALLOWED_CWDS": str(self.ws),
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "PATH": f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}",
        })
        iac = str(bin_dir / "iac-code")
        self.a2a_port = free_port()
        self.agui_port = free_port()
        self.processes: list[Process] = []
        self.kernel = self._spawn("kernel", [iac, "a2a", "--host", "127.0.0.1", "--port", str(self.a2a_port),
                                             "--thinking-exposure", "all"],
                                  dict(env, IACCODE_A2A_HTTP_TOKEN=A2A_TOKEN), logs)
        self.adapter = self._spawn("adapter", [iac, "agui", "--host", "127.0.0.1",
                                               "--port", str(self.agui_port),
                                               "--a2a-url", f"http://127.0.0.1:{self.a2a_port}/",
                                               "--state-dir", str(self.state)],
                                   dict(env, IAC_CODE_AGUI_A2A_TOKEN=A2A_TOKEN), logs)
        # With --a2a-url the adapter does not reach the kernel while it starts: both start at once.
        k = wait_healthy(self.kernel, self.a2a_port, {"Authorization": f"Bearer {A2A_TOKEN}"})
        a = wait_healthy(self.adapter, self.agui_port)
        log(f"kernel healthy after {k:.1f} s, adapter after {a:.1f} s")

    def _spawn(self, name: str, argv: list[str], env: dict[str, str], logs: Path) -> Process:
        p = Process(name, argv, env, logs)
        self.processes.append(p)
        return p

    def restart_adapter(self) -> None:
        """SIGTERM, then the same command on the same state directory (the kernel keeps running)."""
        self.adapter.stop(signal.SIGTERM)
        self.adapter.start()
        t = wait_healthy(self.adapter, self.agui_port)
        log(f"adapter restarted, healthy after {t:.1f} s")

    def close(self) -> None:
        for p in reversed(self.processes):
            p.stop()
        self.llm.close()


# ------------------------------------------------------------------------------------------------
# AG-UI over HTTP/SSE
# ------------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    status: int
    events: list[dict] = field(default_factory=list)
    error: dict | None = None
    disconnected: bool = False

    def text(self) -> str:
        return "".join(e.get("delta", "") for e in self.events if e.get("type") == "TEXT_MESSAGE_CONTENT")

    def session(self) -> dict | None:
        for e in self.events:
            if e.get("type") == "CUSTOM" and e.get("name") == "iac-code.session.v1":
                return e.get("value")
        return None

    def terminal(self) -> dict:
        return self.events[-1] if self.events else {}

    def interrupt_ids(self) -> list[str]:
        outcome = self.terminal().get("outcome") or {}
        return [i["id"] for i in outcome.get("interrupts") or []]

    def describe(self) -> str:
        if self.error is not None:
            return f"HTTP {self.status} {json.dumps(self.error)}"
        t = self.terminal()
        kind = t.get("type")
        if kind == "RUN_FINISHED":
            kind += f" {(t.get('outcome') or {}).get('type')}"
        elif kind == "RUN_ERROR":
            kind += f" {t.get('code')}: {t.get('message')}"
        return f"HTTP {self.status} {kind} after {[e.get('type') for e in self.events]}"


class Driver:
    def __init__(self, stack: Stack, out: Path, cwd_root: str) -> None:
        self.stack = stack
        self.out = out
        self.cwd_root = cwd_root.rstrip("/")
        self.requests: list[dict] = []
        self.written: list[str] = []

    # -- requests --------------------------------------------------------------------------------

    def body(self, thread: str, run: str, text: str | None, *, ros: str, messages: list | None = None,
             resume: list | None = None, extra: dict | None = None, message_id: str | None = None) -> dict:
        iac = {"schemaVersion": 1, "rosInvocationId": ros, "cwd": str(self.stack.ws / thread)}
        iac.update(extra or {})
        if messages is None:
            messages = [{"id": message_id or f"msg-{run}", "role": "user", "content": text}]
        doc: dict[str, Any] = {
            "threadId": thread,
            "runId": run,
            "state": {},
            "messages": messages,
            "tools": [],
            "context": [],
            "forwardedProps": {"iacCode": iac},
        }
        if resume is not None:
            doc["resume"] = resume
        return doc

    def run(self, body: dict, expect: str | tuple[str, str],
            on_event: Callable[[RunResult], str | None] | None = None) -> RunResult:
        """POSTs a run and reads its stream. `on_event` sees the result so far after each event
        and may answer "disconnect". `expect`: "interrupt", "success", "disconnect",
        ("RUN_ERROR", code) or ("409", code)."""
        data = json.dumps(body, ensure_ascii=False).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.stack.agui_port, timeout=120)
        conn.request("POST", "/", body=data,
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        res = RunResult(status=resp.status)
        try:
            if not (resp.getheader("content-type") or "").startswith("text/event-stream"):
                raw = resp.read()
                try:
                    res.error = json.loads(raw).get("error")
                except (ValueError, AttributeError):
                    res.error = {"body": raw.decode(errors="replace")}
            else:
                frame: list[str] = []
                while True:
                    line = resp.readline()
                    if not line:
                        break
                    line_s = line.decode().rstrip("\r\n")
                    if line_s:
                        frame.append(line_s)
                        continue
                    for item in frame:
                        if item.startswith("data: "):
                            res.events.append(json.loads(item[6:]))
                            if on_event is not None and on_event(res) == "disconnect":
                                res.disconnected = True
                                break
                    frame = []
                    if res.disconnected:
                        # The client goes away mid-stream: the connection is shut, not drained.
                        conn.sock.shutdown(socket.SHUT_RDWR)
                        break
        finally:
            conn.close()
        self.requests.append({"threadId": body["threadId"], "runId": body["runId"], "status": res.status,
                              "raw": data.decode()})
        self.check(body, res, expect)
        return res

    def check(self, body: dict, res: RunResult, expect: str | tuple[str, str]) -> None:
        t = res.terminal()
        if expect == "disconnect":
            ok = res.disconnected
        elif expect in ("interrupt", "success"):
            outcome = (t.get("outcome") or {}).get("type")
            ok = res.status == 200 and t.get("type") == "RUN_FINISHED" and outcome == expect
        elif expect[0] == "RUN_ERROR":
            ok = res.status == 200 and t.get("type") == "RUN_ERROR" and t.get("code") == expect[1]
        else:
            ok = str(res.status) == expect[0] and (res.error or {}).get("code") == expect[1]
        if not ok:
            raise HarnessError(f"{body['threadId']} {body['runId']}: expected {expect}, got {res.describe()}")

    def cancel(self, execution_id: str, thread: str, ros: str, expect_status: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.stack.agui_port, timeout=60)
        try:
            conn.request("POST", f"/extensions/iac-code/v1/executions/{execution_id}/cancel",
                         body=json.dumps({"threadId": thread, "rosInvocationId": ros}),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        got = json.loads(raw).get("status") if resp.status == 200 else None
        if got != expect_status:
            raise HarnessError(f"cancel of {thread}: expected {expect_status}, got HTTP {resp.status} {raw!r}")

    def a2a_task_state(self, task_id: str) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", self.stack.a2a_port, timeout=10)
        try:
            conn.request("POST", "/", body=json.dumps({"jsonrpc": "2.0", "id": "poll", "method": "GetTask",
                                                       "params": {"id": task_id, "historyLength": 0}}),
                         headers={"Content-Type": "application/json", "A2A-Version": "1.0",
                                  "Authorization": f"Bearer {A2A_TOKEN}"})
            doc = json.loads(conn.getresponse().read())
        finally:
            conn.close()
        return str(((doc.get("result") or {}).get("status") or {}).get("state"))

    # -- moments ---------------------------------------------------------------------------------

    def snapshot(self, sid: str, moment: str, thread: str) -> None:
        src = self.stack.state / "threads" / f"{thread}.json"
        if not src.is_file():
            raise HarnessError(f"{sid} {moment}: the adapter wrote no {src.name}")
        name = f"{sid}_{moment}.{thread}.json"
        data = src.read_bytes()
        if self.cwd_root:
            # The adapter resolved `cwd` under this run's temporary workspace root; the copy names
            # the fixtures' fixed root instead, so no machine path lands in them.
            real = b'"cwd": ' + json.dumps(f"{self.stack.ws}/", ensure_ascii=False).encode()[:-1]
            if data.count(real) != 1:
                raise HarnessError(f"{sid} {moment}: {thread}'s cwd is not under {self.stack.ws}")
            fixed = json.dumps(f"{self.cwd_root}/", ensure_ascii=False).encode()[:-1]
            data = data.replace(real, b'"cwd": ' + fixed)
        (self.out / name).write_bytes(data)
        self.written.append(name)

    def resolved(self, iid: str, payload: dict | None) -> dict:
        entry: dict[str, Any] = {"interruptId": iid, "status": "resolved"}
        if payload is not None:
            entry["payload"] = payload
        return entry


def only_interrupt(res: RunResult) -> str:
    ids = res.interrupt_ids()
    if len(ids) != 1:
        raise HarnessError(f"expected one interrupt, got {ids}")
    return ids[0]


def after_three_ticks(res: RunResult) -> bool:
    return res.session() is not None and res.text() == "tick0 tick1 tick2 "


ALLOW = {"decision": "allow_once"}

# ------------------------------------------------------------------------------------------------
# Scenarios: each takes its moments with Driver.snapshot
# ------------------------------------------------------------------------------------------------


def s01_plain_turn(d: Driver) -> None:
    # The kernel's first run is the slow one (its session starts).
    d.run(d.body("thread-s1", "run-s1-1", "Say hello. scenario:text", ros="ros-s1-1"), "success")
    d.snapshot("S01", "after_run", "thread-s1")


def s02_reasoning(d: Driver) -> None:
    d.run(d.body("thread-s2", "run-s2-1", "Think first. scenario:think", ros="ros-s2-1",
                 extra={"thinking": {"enabled": True}}), "success")
    d.snapshot("S02", "after_run", "thread-s2")


def s03_permission_allow_once(d: Driver) -> None:
    first = d.body("thread-s3", "run-s3-1", "Run a command. scenario:bash", ros="ros-s3-1",
                   message_id="msg-s3-1")
    iid = only_interrupt(d.run(first, "interrupt"))
    d.snapshot("S03", "after_interrupt", "thread-s3")
    d.run(d.body("thread-s3", "run-s3-2", None, ros="ros-s3-1", messages=first["messages"],
                 resume=[d.resolved(iid, ALLOW)]), "success")
    d.snapshot("S03", "after_resume", "thread-s3")


def s04_denied_and_cancelled(d: Driver) -> None:
    # (a) answered deny; (b) the interrupt cancelled: a permission is then denied, the task goes on.
    for part, answer in (("a", lambda iid: d.resolved(iid, {"decision": "deny"})),
                         ("b", lambda iid: {"interruptId": iid, "status": "cancelled"})):
        thread = f"thread-s4{part}"
        first = d.body(thread, f"run-s4{part}-1", "Run a command. scenario:bash", ros=f"ros-s4{part}-1")
        iid = only_interrupt(d.run(first, "interrupt"))
        d.run(d.body(thread, f"run-s4{part}-2", None, ros=f"ros-s4{part}-1", messages=first["messages"],
                     resume=[answer(iid)]), "success")
        d.snapshot("S04", f"{part}_after_resume", thread)


def s05_cancel_extension(d: Driver) -> None:
    d.stack.llm.hold_slow()
    ros = "ros-s5-1"

    sent = []

    def cancel_after_three_ticks(res: RunResult) -> None:
        if after_three_ticks(res) and not sent:
            sent.append(True)
            d.cancel(res.session()["executionId"], "thread-s5", ros, "cancelled")

    try:
        res = d.run(d.body("thread-s5", "run-s5-1", "Count slowly. scenario:slow", ros=ros),
                    ("RUN_ERROR", "CANCELLED"), on_event=cancel_after_three_ticks)
    finally:
        d.stack.llm.release_slow()
    time.sleep(1.0)
    d.snapshot("S05", "after_cancel", "thread-s5")
    d.cancel(res.session()["executionId"], "thread-s5", ros, "already_terminal")


def s06_client_disconnect(d: Driver) -> None:
    d.stack.llm.hold_slow()
    try:
        res = d.run(d.body("thread-s6", "run-s6-1", "Count slowly. scenario:slow", ros="ros-s6-1"),
                    "disconnect", on_event=lambda r: "disconnect" if after_three_ticks(r) else None)
    finally:
        d.stack.llm.release_slow()
    # Nothing cancels the task: it runs to its end on the kernel, and the adapter's file keeps it.
    task = res.session()["taskId"]
    deadline = time.monotonic() + 60
    while d.a2a_task_state(task) in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"):
        if time.monotonic() > deadline:
            raise HarnessError("S06: the kernel's task did not end after the disconnect")
        time.sleep(0.5)
    time.sleep(2.0)
    d.snapshot("S06", "after_disconnect_and_task_end", "thread-s6")
    d.run(d.body("thread-s6", "run-s6-2", "Again. scenario:text", ros="ros-s6-2"), "success")
    d.snapshot("S06", "after_second_run", "thread-s6")
    d.cancel(res.session()["executionId"], "thread-s6", "ros-s6-1", "already_terminal")


def s06b_disconnect_then_cancel(d: Driver) -> None:
    d.stack.llm.hold_slow()
    try:
        res = d.run(d.body("thread-s6b", "run-s6b-1", "Count slowly. scenario:slow", ros="ros-s6b-1"),
                    "disconnect", on_event=lambda r: "disconnect" if after_three_ticks(r) else None)
        time.sleep(2.0)
        d.snapshot("S06b", "2s_after_disconnect", "thread-s6b")
        # The kernel's task is still held mid-reply: the cancel reaches a running task.
        d.cancel(res.session()["executionId"], "thread-s6b", "ros-s6b-1", "cancelled")
        time.sleep(1.0)
        d.snapshot("S06b", "after_cancel", "thread-s6b")
    finally:
        d.stack.llm.release_slow()


def s07_second_turn(d: Driver) -> None:
    messages = [
        {"id": "msg-run-s1-1", "role": "user", "content": "Say hello. scenario:text"},
        {"id": "assistant-1", "role": "assistant", "content": "Hello from the fake LLM."},
        {"id": "msg-run-s1-2", "role": "user", "content": "And think now. scenario:think"},
    ]
    d.run(d.body("thread-s1", "run-s1-2", None, ros="ros-s1-2", messages=messages), "success")
    d.snapshot("S07", "after_turn2", "thread-s1")


def s08_error_answers(d: Driver) -> None:
    thread, ros = "thread-s8r", "ros-s8r-1"
    first = d.body(thread, "run-s8r-1", "Run a command. scenario:bash", ros=ros)
    iid = only_interrupt(d.run(first, "interrupt"))
    d.snapshot("S08", "pending", thread)

    def resume(run: str, entries: list, ros_: str = ros) -> dict:
        return d.body(thread, run, None, ros=ros_, messages=first["messages"], resume=entries)

    # Refused at admission (409): no run digest is recorded for these.
    d.run(d.body(thread, "run-s8r-2", "new question scenario:text", ros="ros-s8r-2"),
          ("409", "RESUME_REQUIRED"))
    d.run(resume("run-s8r-3", [d.resolved(iid, ALLOW)], "ros-OTHER"), ("409", "EXECUTION_LOST"))
    # Refused in the stream (RUN_ERROR): recorded, and the interrupt stays pending.
    unknown = "permission-does-not-exist"
    for run, entries, code in (
        ("run-s8r-4", [], "INCOMPLETE_RESUME"),
        ("run-s8r-5", [d.resolved(iid, ALLOW), d.resolved(iid, ALLOW)], "INCOMPLETE_RESUME"),
        ("run-s8r-6", [d.resolved(unknown, ALLOW)], "UNKNOWN_INTERRUPT"),
        ("run-s8r-7", [d.resolved(iid, ALLOW), d.resolved(unknown, ALLOW)], "UNKNOWN_INTERRUPT"),
        ("run-s8r-8", [d.resolved(iid, {"decision": "maybe"})], "RESUME_PAYLOAD_INVALID"),
        ("run-s8r-9", [d.resolved(iid, None)], "RESUME_PAYLOAD_INVALID"),
        ("run-s8r-10", [d.resolved(iid, {"decision": "allow_once", "extra": 1})], "RESUME_PAYLOAD_INVALID"),
    ):
        d.run(resume(run, entries), ("RUN_ERROR", code))
    d.snapshot("S08", "after_error_resumes", thread)
    d.run(resume("run-s8r-11", [d.resolved(iid, ALLOW)]), "success")
    d.snapshot("S08", "after_valid_resume", thread)


def s10_pipeline(d: Driver) -> None:
    # The selling pipeline's intent step asks a question; answered with a choice (p1), cancelled
    # (p2: the task is cancelled) and answered with free text (p3).
    for n, answer, expect in (
        ("1", lambda iid: d.resolved(iid, {"selectedId": "none"}), "success"),
        ("2", lambda iid: {"interruptId": iid, "status": "cancelled"}, ("RUN_ERROR", "CANCELLED")),
        ("3", lambda iid: d.resolved(iid, {"freeText": "just chatting"}), "success"),
    ):
        thread = f"thread-p{n}"
        pipeline = {"runMode": "pipeline"}
        first = d.body(thread, f"run-p{n}-1", "hello there scenario:pipeline", ros=f"ros-p{n}-1",
                       extra=pipeline)
        iid = only_interrupt(d.run(first, "interrupt"))
        d.snapshot("S10", "after_interrupt", thread)
        d.run(d.body(thread, f"run-p{n}-2", None, ros=f"ros-p{n}-1", messages=first["messages"],
                     resume=[answer(iid)], extra=pipeline), expect)
        d.snapshot("S10", "after_resume", thread)


def s11_llm_error(d: Driver) -> None:
    d.run(d.body("thread-s11", "run-s11-1", "Fail please. scenario:error", ros="ros-s11-1"),
          ("RUN_ERROR", "A2A_EXECUTION_FAILED"))
    d.snapshot("S11", "after_run", "thread-s11")


def s12_write_file(d: Driver) -> None:
    first = d.body("thread-s12", "run-s12-1", "Write a file. scenario:write", ros="ros-s12-1")
    iid = only_interrupt(d.run(first, "interrupt"))
    d.run(d.body("thread-s12", "run-s12-2", None, ros="ros-s12-1", messages=first["messages"],
                 resume=[d.resolved(iid, ALLOW)]), "success")
    d.snapshot("S12", "final", "thread-s12")


def s14_adapter_restart(d: Driver) -> None:
    first = d.body("thread-s14", "run-s14-1", "Run a command. scenario:bash", ros="ros-s14-1")
    iid = only_interrupt(d.run(first, "interrupt"))
    d.snapshot("S14", "before_restart", "thread-s14")
    d.stack.restart_adapter()
    answer = [d.resolved(iid, ALLOW)]
    # The run digests survive the restart: run 1's id is taken.
    d.run(d.body("thread-s14", "run-s14-1", None, ros="ros-s14-1", messages=first["messages"], resume=answer),
          ("409", "RUN_ID_CONFLICT"))
    d.run(d.body("thread-s14", "run-s14-2", None, ros="ros-s14-1", messages=first["messages"], resume=answer),
          "success")
    d.snapshot("S14", "after_resume", "thread-s14")


def s15_preferred_language(d: Driver) -> None:
    zh = {"preferredLanguage": "zh-CN"}
    first = d.body("thread-s15", "run-s15-1", "Run a command. scenario:bash", ros="ros-s15-1", extra=zh)
    iid = only_interrupt(d.run(first, "interrupt"))
    d.run(d.body("thread-s15", "run-s15-2", None, ros="ros-s15-1", messages=first["messages"],
                 resume=[d.resolved(iid, {"decision": "bogus"})], extra=zh),
          ("RUN_ERROR", "RESUME_PAYLOAD_INVALID"))
    d.run(d.body("thread-s15", "run-s15-3", None, ros="ros-s15-1", messages=first["messages"],
                 resume=[d.resolved(iid, {"decision": "deny"})], extra=zh), "success")
    d.snapshot("S15", "final", "thread-s15")


def s16_two_tool_calls(d: Driver) -> None:
    # Two calls in one LLM message are asked one at a time: two interrupt rounds.
    first = d.body("thread-s16", "run-s16-1", "Two commands. scenario:bash2", ros="ros-s16-1")
    res = d.run(first, "interrupt")
    for n in (1, 2):
        answer = [d.resolved(only_interrupt(res), ALLOW)]
        res = d.run(d.body("thread-s16", f"run-s16-{n + 1}", None, ros="ros-s16-1", messages=first["messages"],
                           resume=answer), "interrupt" if n == 1 else "success")
        d.snapshot("S16", f"after_resume{n}", "thread-s16")


def s17_forwarded_props(d: Driver) -> None:
    d.run(d.body("thread-s17", "run-s17-1", "Say hello. scenario:text", ros="ros-s17-1", extra={
        "model": "fake-model-override",
        "llmApiKey": "per-request-fake-key",
        "llmHeaders": {"X-Harness-Header": "hello"},
        "userId": "user-17",
        "channel": "harness",
        "candidatePresentation": "rich",
        "thinking": {"enabled": True, "effort": "high", "budget": 1024},
    }), "success")
    d.snapshot("S17", "after_a", "thread-s17")


SCENARIOS: list[tuple[str, Callable[[Driver], None]]] = [
    ("S01", s01_plain_turn),
    ("S02", s02_reasoning),
    ("S03", s03_permission_allow_once),
    ("S04", s04_denied_and_cancelled),
    ("S05", s05_cancel_extension),
    ("S06", s06_client_disconnect),
    ("S06b", s06b_disconnect_then_cancel),
    ("S07", s07_second_turn),
    ("S08", s08_error_answers),
    ("S10", s10_pipeline),
    ("S11", s11_llm_error),
    ("S12", s12_write_file),
    ("S14", s14_adapter_restart),
    ("S15", s15_preferred_language),
    ("S16", s16_two_tool_calls),
    ("S17", s17_forwarded_props),
]
NEEDS = {"S07": {"S01"}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--requests", type=Path)
    parser.add_argument("--only", default="")
    parser.add_argument("--cwd-root", default=FIXTURE_WORKSPACE)
    parser.add_argument("--keep-work", action="store_true")
    args = parser.parse_args()

    chosen = {s for s in args.only.split(",") if s}
    unknown = chosen - {sid for sid, _ in SCENARIOS}
    if unknown:
        parser.error(f"unknown scenarios: {sorted(unknown)}")
    for sid in list(chosen):
        chosen |= NEEDS.get(sid, set())

    # A termination request (a test runner's timeout) stops the servers too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.iterdir():
        if FIXTURE_NAME.match(old.name) and (not chosen or old.name.split("_")[0] in chosen):
            old.unlink()

    work = Path(tempfile.mkdtemp(prefix="reference-state-"))
    stack: Stack | None = None
    driver: Driver | None = None
    t0 = time.monotonic()
    try:
        stack = Stack(args.bin, work)
        driver = Driver(stack, args.out, args.cwd_root)
        for sid, scenario in SCENARIOS:
            if chosen and sid not in chosen:
                continue
            t = time.monotonic()
            scenario(driver)
            log(f"{sid} {scenario.__name__}: {time.monotonic() - t:.1f} s")
        log(f"{len(driver.written)} files in {args.out} after {time.monotonic() - t0:.1f} s")
        return 0
    except HarnessError as e:
        log(f"FAILED: {e}")
        if stack is not None:
            for p in stack.processes:
                log(f"--- last lines of the {p.name}'s log ---\n{p.tail()}")
        return 1
    finally:
        if stack is not None:
            stack.close()
        if driver is not None and args.requests is not None:
            args.requests.parent.mkdir(parents=True, exist_ok=True)
            with open(args.requests, "w", encoding="utf-8") as fh:
                for r in driver.requests:
                    fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        if args.keep_work:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
