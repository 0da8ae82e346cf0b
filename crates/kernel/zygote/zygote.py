"""The kernel fork server ("zygote") of iac-code-agui's per-user kernels.

The gateway runs it with the kernel's own interpreter (`python -s -`, this source on standard
input, `PRELOAD` defined before it) and holds the other end of its one channel: a UNIX
SOCK_SEQPACKET socket on descriptor 3. It imports the kernel once, with what a first turn
imports, freezes the heap, and then forks one kernel per request. Nothing of a user's is ever
decoded here: a request's bytes are forked with and read by the child alone, then wiped.

Channel messages (JSON):
  zygote -> gateway  {"ready": {"modules": N, "seconds": S, "unimportable": [...]}}
  gateway -> zygote  8 bytes, the request's id (little-endian), then
                     {"argv": [...], "env": [[k, v], ...], "cwd": "...", "seccomp": "<hex>"}
                     with three descriptors: the kernel's stdout, its stderr, its Landlock ruleset
  zygote -> gateway  {"id": ID, "forked": PID} with the child's pidfd, or {"id": ID, "refused": "why"}
  zygote -> gateway  {"exited": PID, "status": RAW_WAIT_STATUS}
End of file on the channel (the gateway is gone): every child is killed, the zygote exits. A
child's process group is killed when the child exits, before it is reaped (its leftovers).

A child, before it reads anything from the network: joins a process group of its own, dies with
the zygote, keeps only its three descriptors and those the imported modules hold, confines
itself (capabilities, no_new_privs, Landlock, seccomp), takes its user's environment and
directory, resets what modules computed at import from the zygote's environment, then runs
`iac-code` with its argv as the console script does.
"""
import array
import ctypes
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import time

STARTED = time.monotonic()
CHANNEL_FD = 3
# A SEQPACKET message is bounded by the socket's buffer (about 208 KiB by default).
MAX_REQUEST = 192 << 10
MAX_FDS = 3
ID_LEN = 8

# Run from standard input, Python puts the working directory first on the module path: a forked
# kernel works in its user's HOME, whose files must never be importable.
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.prctl.restype = ctypes.c_int

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_SET_MODE_FILTER = 1
_SYSCALLS = {
    # machine: (capset, landlock_restrict_self, seccomp)
    "x86_64": (126, 446, 317),
    "aarch64": (91, 446, 277),
    "riscv64": (91, 446, 277),
}


def log(text, stream=None):
    stream = stream or sys.stdout
    stream.write(f"iac-code-agui zygote: {text}\n")
    stream.flush()


def preload(names):
    """Imports the kernel and what its first turn imports. A module that cannot be imported here
    (another platform's) is named, not fatal; the kernel's entry point must import."""
    unimportable = []
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001 - an optional module, a platform's
            unimportable.append(f"{name}: {type(e).__name__}")
    import iac_code.cli.main  # noqa: F401 - the entry point: an error here is the zygote's end

    return unimportable


def send(chan, message, fds=()):
    data = json.dumps(message).encode()
    if fds:
        chan.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        chan.sendmsg([data])


def receive(chan, buf):
    """One request: its length in `buf` and the descriptors that came with it (0: end of file;
    -1: a request cut short, refused, and wiped)."""
    fds = array.array("i")
    n, ancillary, flags, _ = chan.recvmsg_into([buf], socket.CMSG_SPACE(MAX_FDS * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or 0 < n < ID_LEN:
        for fd in fds:
            os.close(fd)
        buf[:] = bytes(len(buf))
        return -1, []
    return n, list(fds)


def check(result, what):
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def confine(ruleset_fd, seccomp_hex):
    """What `Prepared::enforce` does in a spawned kernel: every capability dropped, no_new_privs,
    the Landlock ruleset, then the seccomp filter compiled by the gateway."""
    capset, restrict_self, seccomp = _SYSCALLS[os.uname().machine]
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            # EINVAL: past the last capability; EPERM: no CAP_SETPCAP, nothing to drop.
            if ctypes.get_errno() in (1, 22):
                break
            check(-1, "PR_CAPBSET_DROP")
    check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "PR_CAP_AMBIENT")
    header = ctypes.create_string_buffer(bytes(array.array("I", [0x20080522, 0])), 8)
    data = ctypes.create_string_buffer(bytes(24), 24)
    check(libc.syscall(capset, header, data), "capset")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    check(libc.syscall(restrict_self, ctypes.c_int(ruleset_fd), ctypes.c_uint(0)), "landlock_restrict_self")
    os.close(ruleset_fd)
    program = bytes.fromhex(seccomp_hex)
    if not program or len(program) % 8:
        raise OSError(22, "no seccomp filter")
    filters = ctypes.create_string_buffer(program, len(program))

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Fprog(len(program) // 8, ctypes.addressof(filters))
    check(libc.syscall(seccomp, ctypes.c_ulong(SECCOMP_SET_MODE_FILTER), ctypes.c_ulong(0), ctypes.byref(prog)), "seccomp")


def reset_import_state():
    """What modules computed at import from the zygote's environment (HOME, locale, proxies,
    ALIBABA_CLOUD_*, OPENAI_*), computed again from the user's: found by tracing every
    environment read and every module global holding the zygote's HOME during the imports."""
    import site
    import tempfile
    import urllib.request

    tempfile.tempdir = None
    site.USER_BASE = None
    site.USER_SITE = None
    i18n = sys.modules.get("iac_code.i18n")
    if i18n is not None:
        i18n.setup_i18n()
    for name in ("alibabacloud_credentials.utils.auth_constant", "alibabacloud_credentials.utils.auth_util"):
        if name in sys.modules:
            importlib.reload(sys.modules[name])
    aliyun = sys.modules.get("iac_code.services.providers.aliyun")
    if aliyun is not None:
        aliyun.DEFAULT_ALIYUN_CLI_CONFIG_PATH = os.path.expanduser("~/.aliyun/config.json")
    oauth = sys.modules.get("iac_code.mcp.oauth")
    if oauth is not None:
        oauth._OAUTH_METADATA_OPENER = urllib.request.build_opener(oauth._NoOAuthMetadataRedirectHandler)
        oauth._OAUTH_TOKEN_OPENER = urllib.request.build_opener(oauth._NoOAuthTokenRedirectHandler)
    openai = sys.modules.get("openai")
    if openai is not None:
        openai.api_type = os.environ.get("OPENAI_API_TYPE")
        openai.api_version = os.environ.get("OPENAI_API_VERSION")
        openai.azure_endpoint = os.environ.get("AZURE_OPENAI_ENDPOINT")


def report_late_imports():
    """With IAC_CODE_AGUI_ZYGOTE_TRACE_IMPORTS=1 (the zygote's): each module a kernel imports
    after the fork, on its stderr (what the preload list missed)."""

    def hook(event, args):
        if event == "import" and args and args[0] not in sys.modules:
            sys.stderr.write(f"iac-code-agui zygote: late import {args[0]}\n")

    sys.addaudithook(hook)


def child(request, fds, keep, zygote):
    """The forked kernel. Never returns. Until it is confined it may reach what the zygote
    may (every user's directories): any failure before then ends it at once."""
    code = 70
    confined = False
    try:
        os.setpgid(0, 0)
        check(libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0), "PR_SET_PDEATHSIG")
        # What `ps` and `top` name it (its command line stays the zygote's).
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(b"iac-code-kernel"), 0, 0, 0)
        if os.getppid() != zygote:
            os._exit(1)
        signal.set_wakeup_fd(-1)
        for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if len(fds) != MAX_FDS:
            raise OSError(22, f"{len(fds)} descriptors, not {MAX_FDS}")
        stdout, stderr, ruleset = fds
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        # The ruleset takes the channel's number: the channel is closed with it.
        os.dup2(ruleset, CHANNEL_FD, inheritable=False)
        for fd in os.listdir("/proc/self/fd"):
            fd = int(fd)
            if fd > CHANNEL_FD and fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        req = json.loads(bytes(request))
        # Landlock and seccomp bind the calling thread (and what it starts): it must be the
        # only one.
        if len(os.listdir("/proc/self/task")) != 1:
            raise OSError(16, "more than one thread before confinement")
        confine(CHANNEL_FD, req["seccomp"])
        confined = True
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in req["env"]})
        os.chdir(req["cwd"])
        # What a fresh interpreter would take from the user's environment at its start.
        if os.environ.get("PYTHONUNBUFFERED"):
            sys.stdout.reconfigure(write_through=True)
            sys.stderr.reconfigure(write_through=True)
        sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
        # The console script's directory leads the module path, as in a spawned kernel.
        sys.path.insert(0, os.path.dirname(os.path.abspath(req["argv"][0])))
        reset_import_state()
        if TRACE_IMPORTS:
            log("tracing late imports", sys.stderr)
            report_late_imports()
        gc.enable()
        sys.argv = [str(a) for a in req["argv"]]
        from iac_code.cli.main import app

        try:
            app()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - whatever it is, the child ends here
        import traceback

        traceback.print_exc()
        if not confined:
            # No exit handler runs outside the user's confinement.
            sys.stderr.flush()
            os._exit(70)
        code = 70
    finally:
        try:
            import atexit
            import threading

            threading._shutdown()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def kill_all(children):
    for pid in children:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def main():
    zygote = os.getpid()
    chan = socket.socket(fileno=CHANNEL_FD)
    unimportable = preload(PRELOAD)  # noqa: F821 - defined before this source by the gateway
    gc.collect()
    gc.freeze()
    gc.disable()
    tasks = os.listdir("/proc/self/task")
    if len(tasks) != 1:
        log(f"{len(tasks)} threads after the imports: a fork would copy a lock held by one", sys.stderr)
        sys.exit(3)
    # The descriptors the imports opened: theirs to keep in a child (a module may write to one).
    keep = set()
    for fd in os.listdir("/proc/self/fd"):
        # The listing's own descriptor is closed by now: only those still open are kept.
        try:
            os.fstat(int(fd))
            keep.add(int(fd))
        except OSError:
            pass
    keep -= {0, 1, 2, CHANNEL_FD}
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    children = set()
    seconds = round(time.monotonic() - STARTED, 2)
    log(f"{len(sys.modules)} modules imported in {seconds} s; {len(unimportable)} not importable")
    send(chan, {"ready": {"modules": len(sys.modules), "seconds": seconds, "unimportable": unimportable}})
    buf = bytearray(MAX_REQUEST)
    poller = select.poll()
    poller.register(CHANNEL_FD, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        for fd, _ in events:
            if fd == wake_r:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                while children:
                    try:
                        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                    except ChildProcessError:
                        break
                    if info is None:
                        break
                    pid = info.si_pid
                    # Its group's leftovers, while the unreaped child still holds the group's id.
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except OSError:
                        pass
                    _, status = os.waitpid(pid, 0)
                    children.discard(pid)
                    send(chan, {"exited": pid, "status": status})
                continue
            n, fds = receive(chan, buf)
            if n == 0:
                kill_all(children)
                os._exit(0)
            if n < 0:
                send(chan, {"id": 0, "refused": "a request the zygote cannot read whole"})
                continue
            # The id alone is read here; the rest is the child's.
            ident = int.from_bytes(buf[:ID_LEN], "little")
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as e:
                pid = None
                reason = f"fork: {e.strerror}"
            if pid == 0:
                chan.detach()
                os.close(wake_r)
                os.close(wake_w)
                child(buf[ID_LEN:n], fds, keep, zygote)
            # The request is the child's: wiped here, so that no later child finds it.
            buf[:n] = bytes(n)
            for f in fds:
                os.close(f)
            if pid is None:
                send(chan, {"id": ident, "refused": reason})
                continue
            children.add(pid)
            pidfd = os.pidfd_open(pid)
            try:
                send(chan, {"id": ident, "forked": pid}, [pidfd])
            finally:
                os.close(pidfd)


TRACE_IMPORTS = os.environ.get("IAC_CODE_AGUI_ZYGOTE_TRACE_IMPORTS") == "1"

if __name__ == "__main__":
    main()
