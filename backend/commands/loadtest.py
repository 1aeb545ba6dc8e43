"""`retake loadtest`: directing sessions (`--sessions N`), live conversations (`--converse`) or
reconnects and resumes (`--resume`) at once against a running server (or a balancer), measured
on the client.

The clients and their measurements live apart from the server, in backend/tools/
(loadtest.py for directing sessions, conversation_load.py for conversations, resume_load.py for
resumes); this module is the command line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "loadtest"
HELP = "run N directing sessions at once against a server; report first-audio latency and playback gaps"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="ws://127.0.0.1:8000/ws", help="the server's /ws (default %(default)s)")
    parser.add_argument("--sessions", type=int, default=4, help="concurrent sessions (default 4)")
    parser.add_argument("--takes", type=int, default=3, help="takes per session, one after another (default 3)")
    parser.add_argument("--max-new-tokens", type=int, default=200, help="frames per take at most (default 200)")
    parser.add_argument("--stagger-ms", type=float, default=50.0, help="delay between session starts (default 50)")
    parser.add_argument("--no-keep", action="store_true", help="do not keep takes (no growing history)")
    parser.add_argument("--think-ms", type=float, default=0.0,
                        help="a director's pause before each take, reading the next line (default 0); the server "
                             "warms the line's prompt meanwhile")
    parser.add_argument("--script", action="store_true",
                        help="write each session's lines into its script before taking them, as the studio does "
                             "(the server then warms each line with its text)")
    parser.add_argument("--listen", action="store_true",
                        help="hear each take to its end before the next, as a director does (by default the next "
                             "take is asked as soon as the last audio arrives, while the take still plays)")
    parser.add_argument("--token", help="bearer token, if the server wants one")
    parser.add_argument("--json", type=Path, help="also write every take's numbers to this file")
    parser.add_argument("--converse", action="store_true",
                        help="run --sessions live conversations on /converse instead (retake serve --converse), "
                             "each a user talking in real time for --seconds")
    parser.add_argument("--resume", action="store_true",
                        help="measure reconnect and resume instead: make --sessions scenes of --takes kept takes, "
                             "then resume each --resumes times over, all at once; print resumes per second")
    parser.add_argument("--resumes", type=int, default=50, help="with --resume: resumes per scene (default 50)")
    parser.add_argument("--seconds", type=float, default=10.0, help="with --converse: how long each user talks "
                                                                    "(default 10)")
    parser.add_argument("--join", type=int, default=0, metavar="N",
                        help="with --converse: N more conversations open one after another while the others talk "
                             "(their system prompt time, and the others' tick latency meanwhile)")
    parser.add_argument("--join-after", type=float, default=2.0, metavar="S",
                        help="with --join: seconds after every first conversation listens (default 2)")
    parser.add_argument("--aligned", action="store_true",
                        help="with --converse: every user's 80 ms schedule starts when their conversation listens "
                             "(by default each starts at a phase of its own within the frame, as microphones do)")
    parser.add_argument("--join-every", type=float, default=1.0, metavar="S",
                        help="with --join: seconds between joins (default 1)")
    parser.add_argument("--processes", type=int, metavar="N",
                        help="with --converse: client processes the conversations are spread over (default: one "
                             "per 32 conversations, at most half the CPUs), so the client's own event loop is not "
                             "what is measured")


def run(args: argparse.Namespace) -> int:
    from backend.cli import UsageError

    if args.sessions < 1 or args.takes < 1 or args.max_new_tokens < 1:
        raise UsageError("--sessions, --takes and --max-new-tokens must be at least 1")
    if not 0 <= args.think_ms < 3_600_000:
        raise UsageError(f"--think-ms must be from 0 to 3600000 (an hour); got {args.think_ms:g}")
    if args.resume:
        from backend.tools import resume_load

        if args.resumes < 1:
            raise UsageError("--resumes must be at least 1")
        return resume_load.run(args.url, args.sessions, args.takes, args.resumes, args.token)
    if args.converse:
        from backend.tools import conversation_load

        if not args.seconds > 0:
            raise UsageError("--seconds must be positive")
        if args.join < 0 or args.join_after < 0 or args.join_every < 0:
            raise UsageError("--join, --join-after and --join-every must be at least 0")
        if args.processes is not None and args.processes < 1:
            raise UsageError("--processes must be at least 1")
        url = args.url.removesuffix("/ws") + "/converse" if args.url.endswith("/ws") else args.url
        joins = conversation_load.Joins(args.join, args.join_after, args.join_every)
        return conversation_load.run(url, args.sessions, args.seconds, args.stagger_ms, args.token, joins,
                                     args.json, aligned=args.aligned, processes=args.processes)
    from backend.tools import loadtest

    return loadtest.run(loadtest.LoadTest(url=args.url, sessions=args.sessions, takes=args.takes,
                                          max_new_tokens=args.max_new_tokens, stagger_ms=args.stagger_ms,
                                          keep=not args.no_keep, token=args.token, json=args.json,
                                          think_ms=args.think_ms, script=args.script, listen=args.listen))
