"""`preemptctl replay`: re-derive decisions from a log, offline, and compare them with a record."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from streams.common.errors import UsageError
from streams.common.options import load_config, load_key
from streams.common.progress import Progress
from streams.kafka import connection, logio
from streams.pipeline import fold
from streams.pipeline.fold import tune_gc
from streams.sim import simulator

EXAMPLES = """examples:
  preemptctl replay trace.jsonl --simulate --decisions-out d.jsonl     the run, without a broker
  preemptctl replay exported-events.jsonl --compare decisions.jsonl     audit a recorded run
  preemptctl replay kafka://127.0.0.1:9092/preemption.cluster-events \\
      --compare kafka://127.0.0.1:9092/preemption.decisions
"""


def compare(derived: list[dict[str, Any]], recorded: list[dict[str, Any]]) -> list[str]:
    """One line per decision that differs (by id), is missing, or is extra."""
    fields = ("outcome", "node", "placements", "victims", "flow", "preemptor")
    got = {d["id"]: d for d in derived}
    want = {d["id"]: d for d in recorded}
    diffs = []
    for rid in [d["id"] for d in recorded if d["id"] not in got]:
        diffs.append(f"{rid}: recorded but not re-derived ({want[rid]['outcome']})")
    for d in derived:
        rec = want.get(d["id"])
        if rec is None:
            diffs.append(f"{d['id']}: re-derived but not recorded ({d['outcome']})")
            continue
        changed = [f for f in fields if d.get(f) != rec.get(f)]
        if changed:
            parts = ", ".join(f"{f} {_short(rec.get(f))} -> {_short(d.get(f))}" for f in changed)
            diffs.append(f"{d['id']}: {parts}")
    return diffs


def _short(value: Any) -> str:
    if isinstance(value, list):
        # name:action, so a change of action alone (victimAction) is visible in the diff line.
        return (
            "["
            + ", ".join(
                f"{v.get('name', '?')}:{v.get('action', '?')}" if isinstance(v, dict) else str(v)
                for v in value
            )
            + "]"
        )
    return str(value)


def cmd(args: argparse.Namespace) -> int:
    tune_gc()
    config = load_config(args.config)
    key = load_key(args.hmac_key_file)
    started = time.perf_counter()
    bad: list[str] = []
    kafka = connection.for_locations(args)
    events = logio.read_events(args.log, on_bad=bad.append, kafka=kafka)
    if args.simulate:
        if len({e.get("cluster") or "default" for e in events}) > 1:
            raise UsageError("--simulate plays one cluster: split a multi-cluster trace by cluster")
        result = simulator.simulate(events, config, key=key)
        if args.log_out:
            logio.write_jsonl(Path(args.log_out), result.log)
    else:
        progress = Progress(len(events), "replay")
        result = fold.fold(events, config, key=key, progress=progress)
        progress.close()
    elapsed = time.perf_counter() - started
    decisions: list[dict[str, Any]] = [dict(d) for d in result.decisions]
    if args.decisions_out:
        logio.write_jsonl(Path(args.decisions_out), decisions)
    elif not args.compare:
        for d in decisions:
            sys.stdout.write(orjson.dumps(d).decode() + "\n")
    for line in bad:
        print(f"skipped undecodable record {line}", file=sys.stderr)
    for n, reason in result.bad:
        print(f"skipped bad event #{n}: {reason}", file=sys.stderr)
    rate = result.events / elapsed if elapsed > 0 else 0.0
    print(
        f"replayed {result.events} events into {len(decisions)} decisions "
        f"in {elapsed:.2f}s ({rate:,.0f} events/s)",
        file=sys.stderr,
    )
    if args.compare:
        diffs = compare(decisions, logio.read_decisions(args.compare, kafka=kafka))
        for line in diffs:
            print(line)
        print(f"{len(diffs)} decision(s) differ", file=sys.stderr)
        return 1 if diffs else 0
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="re-derive decisions from an event log (JSONL or kafka://) and compare",
        description="Fold a cluster-events log as recorded (the audit path), or run a trace through the "
        "simulated cluster (--simulate), and print or write the decision log.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("log", metavar="LOG", help="JSONL trace/export, or kafka://host:port/topic")
    p.add_argument(
        "--simulate", action="store_true", help="treat LOG as a trace and add the cluster's reactions"
    )
    p.add_argument("--decisions-out", metavar="FILE", help="write the decision log here (JSONL)")
    p.add_argument("--log-out", metavar="FILE", help="with --simulate: write the full event log here")
    p.add_argument(
        "--compare", metavar="RECORDED", help="recorded decisions (JSONL or kafka://): report differences"
    )
    p.add_argument("--config", help="engine config YAML")
    p.add_argument("--hmac-key-file", help="sign re-derived records with this key (to compare signed logs)")
    connection.add_arguments(p, required=False)
    p.set_defaults(func=cmd)
