"""`mlx-serve service print-plist | print-systemd [options] [--] [server flags]`.

Prints a launchd property list (macOS) or a systemd unit (Linux) that runs this mlx-serve with
the given server flags. The flags are checked here, so a typo fails now rather than in a
restart loop. Templates with comments live in deploy/launchd and deploy/systemd.
"""

from __future__ import annotations

import argparse
import getpass
import os
import plistlib
import pwd
import re
import sys
from pathlib import Path
from typing import Any

from mlx_serve.server.config import load_config

LABEL = "local.mlx-serve"
THROTTLE_INTERVAL_S = 10
# Beyond --shutdown-timeout-s: time for error frames, the engine's exit and the interpreter's.
STOP_MARGIN_S = 15
OPEN_FILES = 8192


def default_program() -> list[str]:
    """The `mlx-serve` script beside this interpreter (symlinks kept: a venv must stay a venv)."""
    script = Path(sys.executable).absolute().parent / "mlx-serve"
    if script.exists():
        return [str(script)]
    return [str(Path(sys.executable).absolute()), "-m", "mlx_serve"]


def home_of(user: str) -> str:
    try:
        return pwd.getpwnam(user).pw_dir
    except KeyError:
        return str(Path.home())


def _env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"mlx-serve service: --env wants NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def plist(
    args: argparse.Namespace, program: list[str], flags: list[str], stop_timeout_s: float
) -> dict[str, Any]:
    """A LaunchAgent (or, with --daemon, a LaunchDaemon run as --user) for this server."""
    home = home_of(args.user)
    log_dir = Path(
        args.log_dir
        or (Path(home) / "Library/Logs/mlx-serve" if not args.daemon else "/Library/Logs/mlx-serve")
    )
    bin_dir = str(Path(program[0]).parent)
    env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/opt/homebrew/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "PYTHONUNBUFFERED": "1",
        "HOME": home,
        **_env(args.env),
    }
    out: dict[str, Any] = {
        "Label": args.label,
        "ProgramArguments": program + flags,
        "WorkingDirectory": str(Path(args.working_directory).absolute()),
        "EnvironmentVariables": env,
        "RunAtLoad": True,
        "KeepAlive": True,
        "ThrottleInterval": THROTTLE_INTERVAL_S,
        "ExitTimeOut": int(stop_timeout_s),
        "ProcessType": "Interactive",
        "SoftResourceLimits": {"NumberOfFiles": OPEN_FILES},
        "StandardOutPath": str(log_dir / "mlx-serve.log"),
        "StandardErrorPath": str(log_dir / "mlx-serve.log"),
    }
    if args.daemon:
        out["UserName"] = args.user
    return out


def systemd_quote(arg: str) -> str:
    """One ExecStart word: systemd expands % specifiers and $VARS, and splits on spaces."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not re.search(r"[\s\"'\\;]", arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_unit(
    args: argparse.Namespace, program: list[str], flags: list[str], stop_timeout_s: float
) -> str:
    env = {"PYTHONUNBUFFERED": "1", "HOME": home_of(args.user), **_env(args.env)}
    environment = "".join(f"Environment={systemd_quote(f'{k}={v}')}\n" for k, v in env.items())
    return f"""[Unit]
Description=mlx-serve: OpenAI- and Anthropic-compatible LLM server on MLX
After=network-online.target
Wants=network-online.target

[Service]
Type=exec
User={args.user}
WorkingDirectory={Path(args.working_directory).absolute()}
{environment}EnvironmentFile=-/etc/mlx-serve/environment
ExecStart={" ".join(systemd_quote(a) for a in program + flags)}
# SIGTERM to mlx-serve only: it drains open streams, then stops its engine process itself.
KillMode=mixed
KillSignal=SIGTERM
TimeoutStopSec={int(stop_timeout_s)}
Restart=always
RestartSec=5
LimitNOFILE=65536
NoNewPrivileges=true
PrivateTmp=true
ProtectSystem=full

[Install]
WantedBy=multi-user.target
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mlx-serve service",
        allow_abbrev=False,
        description="Print a service definition that runs mlx-serve with the "
        "server flags that follow (after the options, or after --).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name, what in (
        ("print-plist", "a launchd plist (macOS)"),
        ("print-systemd", "a systemd unit (Linux)"),
    ):
        s = sub.add_parser(name, help=f"print {what}", allow_abbrev=False)
        s.add_argument("--user", default=getpass.getuser(), help="account the server runs as")
        s.add_argument("--working-directory", default=os.getcwd(), help="where it runs (default: here)")
        s.add_argument("--program", help="the mlx-serve executable (default: the one beside this Python)")
        s.add_argument(
            "--env",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="an environment variable for the server (repeatable)",
        )
        if name == "print-plist":
            s.add_argument("--label", default=LABEL, help=f"launchd label ({LABEL})")
            s.add_argument(
                "--daemon",
                action="store_true",
                help="a LaunchDaemon run as --user (default: a LaunchAgent of this user)",
            )
            s.add_argument(
                "--log-dir",
                help="log folder (~/Library/Logs/mlx-serve; /Library/Logs/mlx-serve "
                "for --daemon); create it before loading",
            )
    return p


def split_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """Service options, then the server's flags (everything after `--`, or not ours)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def main(argv: list[str]) -> int:
    ours, flags = split_flags(argv)
    args, rest = build_parser().parse_known_args(ours)
    flags = rest + flags
    config = load_config(flags)  # exits with the server's own message on a bad flag
    if "--api-key" in flags or any(f.startswith("--api-key=") for f in flags):
        print(
            "mlx-serve service: warning: --api-key puts the key in the service file and in `ps`; "
            "prefer --api-key-file",
            file=sys.stderr,
        )
    program = [args.program] if args.program else default_program()
    stop_timeout_s = config.shutdown_timeout_s + STOP_MARGIN_S
    if args.command == "print-plist":
        sys.stdout.buffer.write(plistlib.dumps(plist(args, program, flags, stop_timeout_s)))
    else:
        sys.stdout.write(systemd_unit(args, program, flags, stop_timeout_s))
    return 0
