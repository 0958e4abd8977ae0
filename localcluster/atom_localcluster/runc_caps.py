#!/usr/bin/env python3
"""runc, minus the capabilities this machine's capability bounding set lacks: docker's runtime for kind's nodes.

``docker run --privileged`` (kind runs every node so) asks runc for every capability the kernel knows. Where
root's bounding set lacks one — on this machine CAP_SYS_RESOURCE, dropped by the VM's init — runc 1.1 fails
with "unable to apply caps: operation not permitted" and no privileged container starts. This wrapper removes
exactly the capabilities nobody here can hold from the OCI spec (``create``/``run``: the bundle's config.json;
``exec``: the --process file) and then execs the real runc with the same arguments; a container that asks for
none of them is passed through unchanged. Registered by :func:`atom_localcluster.kind.ensure_privileged_runtime`.

Standard library only, no project imports: dockerd runs it directly.
"""

import json
import os
import sys

# linux/include/uapi/linux/capability.h, in bit order (CAP_CHOWN = 0 ... CAP_CHECKPOINT_RESTORE = 40).
CAPS = (
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE NET_BIND_SERVICE "
    "NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT "
    "SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP "
    "MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE"
).split()
RUNC = os.environ.get("ATOM_REAL_RUNC", "runc")


def missing_caps() -> set[str]:
    """``CAP_<NAME>`` for each known capability outside this process's bounding set."""
    with open("/proc/self/status") as f:
        bounding = int(next(line for line in f if line.startswith("CapBnd:")).split()[1], 16)
    return {f"CAP_{name}" for bit, name in enumerate(CAPS) if not bounding >> bit & 1}


def strip(path: str, key: tuple[str, ...], missing: set[str]) -> None:
    with open(path) as f:
        spec = json.load(f)
    caps = spec
    for k in key:
        caps = caps.get(k) or {}
    changed = False
    for kind, names in caps.items():
        if isinstance(names, list) and missing & set(names):
            caps[kind] = [n for n in names if n not in missing]
            changed = True
    if changed:
        tmp = f"{path}.atom-tmp"
        with open(tmp, "w") as f:
            json.dump(spec, f)
        os.replace(tmp, path)


def option(args: list[str], *names: str) -> str | None:
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def main() -> None:
    args = sys.argv[1:]
    missing = missing_caps()
    if missing:
        command = next((a for a in args if a in ("create", "run", "exec")), None)
        if command in ("create", "run"):
            bundle = option(args, "--bundle", "-b") or "."
            strip(os.path.join(bundle, "config.json"), ("process", "capabilities"), missing)
        elif command == "exec":
            process = option(args, "--process", "-p")
            if process:
                strip(process, ("capabilities",), missing)
    os.execvp(RUNC, [RUNC, *args])


if __name__ == "__main__":
    main()
