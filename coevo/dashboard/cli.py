"""The ``coevo runs serve RUN_DIR [--host H] [--port N] [--refresh S]`` sub-command.

Checks the run folder (:func:`coevo.dashboard.reader.open_run`), builds the Dash app
(:func:`coevo.dashboard.app.create_app`) and serves it with Werkzeug's threaded WSGI server on ``host:port``
(``--port 0`` picks a free port), printing the URL on one line (``serving <url>``) once the socket
listens. Bad input (not a run folder, a store of another schema version, a busy or unreadable database, a
port in use, a missing ``dash`` extra) prints one message on stderr and returns exit code 2; Ctrl-C stops
the server with exit code 0.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import logging
import sys

PROG = "coevo runs serve"


def add_parser(runs_subparsers: argparse._SubParsersAction) -> None:
    """Register ``serve`` under ``coevo runs``."""
    p = runs_subparsers.add_parser("serve", help="a local, read-only web dashboard over a run (live while it runs)")
    p.add_argument("run_dir", help="a run folder (made by `coevo run`)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8050, help="TCP port (default 8050; 0 = any free port)")
    p.add_argument("--refresh", type=float, default=2.0, metavar="S", help="seconds between checks for new rows")
    p.set_defaults(func=cmd_serve)


def _fail(message: str) -> int:
    from coevo.errors import error_line

    print(error_line(PROG, message), file=sys.stderr)
    return 2


def _make_server(make_server, host: str, port: int, app):
    """Werkzeug's server on ``host:port``; a port in use raises the ``OSError`` (Werkzeug itself would print
    its own lines to stderr and ``sys.exit(1)``, so the socket is tried first, quietly).

    Raises:
        OSError: the address cannot be bound (in use, not an address of this machine, no permission).
    """
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if port:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Werkzeug binds
            probe.bind((host, port))
    try:
        return make_server(host, port, app, threaded=True)
    except SystemExit as exc:  # a race: taken between the probe and the server
        raise OSError(errno.EADDRINUSE, "address in use") from exc


def _listen_problem(exc: OSError, port: int) -> str:
    """What an ``OSError`` from binding means for the user, in words, with the fix."""
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} is in use by another program; choose another with --port N (--port 0 picks a free one)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "the address is not one of this machine's; use --host 127.0.0.1 (this machine only) or 0.0.0.0"
    if exc.errno == errno.EACCES:
        return f"no permission to listen on port {port} (ports below 1024 need root); choose a port above 1023"
    return exc.strerror or str(exc)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the dashboard until interrupted; returns the exit code (0, or 2 on bad input)."""
    from coevo.dashboard.reader import DashboardError, open_run

    if not 0 <= args.port <= 65535:
        return _fail(f"--port must be in 0..65535, got {args.port}")
    if not args.refresh > 0:
        return _fail(f"--refresh must be > 0 seconds, got {args.refresh}")
    try:
        reader = open_run(args.run_dir)
    except DashboardError as exc:
        return _fail(str(exc))
    try:
        try:
            from werkzeug.serving import make_server

            from coevo.dashboard.app import create_app
        except ImportError as exc:
            return _fail(f"the dashboard needs the `dash` extra ({exc.name} is missing): pip install 'coevo[dash]'")
        app = create_app(reader, refresh_s=args.refresh)
        try:
            server = _make_server(make_server, args.host, args.port, app.server)
        except OSError as exc:
            return _fail(f"cannot listen on {args.host}:{args.port}: {_listen_problem(exc, args.port)}")
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        host = args.host if ":" not in args.host else f"[{args.host}]"
        try:
            loopback = ipaddress.ip_address(args.host).is_loopback
        except ValueError:
            loopback = args.host == "localhost"
        if not loopback:
            print(f"{PROG}: warning: listening on {args.host}, reachable from other machines", file=sys.stderr)
        print(f"serving http://{host}:{server.server_port}/ (run {reader.run_id}, read-only; Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    finally:
        reader.close()
    return 0
