"""`preemptctl replay`: re-derive decisions from a log, offline, and compare them with a record."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from fold import fleet
from fold.fleet import tune_gc
from schemas import chain
from streams.common.errors import UsageError
from streams.common.options import load_config, load_key
from streams.common.progress import Progress
from streams.kafka import connection, logio
from streams.sim import simulator

# The fields a difference is shown by, when one of them differs; otherwise the line names
# every top-level field whose bytes differ (hash, reason, explanation, ...).
SHOWN_FIELDS = ("outcome", "node", "placements", "victims", "flow", "preemptor")
# A record re-derived with these different is a what-if (--config, another engine).
WHAT_IF_FIELDS = ("configHash", "engineVersion")


def compare(derived: list[dict[str, Any]], recorded: list[dict[str, Any]]) -> list[str]:
    """One line per difference, by id: recorded but not re-derived (missing), re-derived but
    not recorded (extra), recorded more than once (doubled), or not byte-identical.

    Records are compared as compact JSON (orjson, the bytes the worker publishes), so any
    change to any field counts; whitespace in a hand-kept file does not. A record re-derived
    under another config or engine version (its configHash or engineVersion differs: a
    what-if) differs in its bytes anyway, so only its decision (SHOWN_FIELDS) is compared.
    Lines follow the recorded order, the extra ones the re-derived order.
    """
    got = {d["id"]: d for d in derived}
    counts = Counter(d["id"] for d in recorded)
    diffs = []
    reported: set[str] = set()
    for rec in recorded:
        rid = rec["id"]
        if rid in reported:
            continue
        reported.add(rid)
        if counts[rid] > 1:
            diffs.append(f"{rid}: recorded {counts[rid]} times")
        d = got.get(rid)
        if d is None:
            diffs.append(f"{rid}: recorded but not re-derived ({_short(rec.get('outcome'))})")
            continue
        if orjson.dumps(d) == orjson.dumps(rec):
            continue
        changed = [f for f in SHOWN_FIELDS if d.get(f) != rec.get(f)]
        if changed:
            parts = ", ".join(f"{f} {_short(rec.get(f))} -> {_short(d.get(f))}" for f in changed)
            diffs.append(f"{rid}: {parts}")
        elif any(d.get(f) != rec.get(f) for f in WHAT_IF_FIELDS):
            continue  # another policy, the same decision
        else:
            fields = [
                f for f in dict.fromkeys([*rec, *d]) if orjson.dumps(rec.get(f)) != orjson.dumps(d.get(f))
            ]
            diffs.append(f"{rid}: bytes differ ({', '.join(fields) or 'field order'})")
    for d in derived:
        if d["id"] not in counts:
            diffs.append(f"{d['id']}: re-derived but not recorded ({d['outcome']})")
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
    # First: a file that is not a decision log ends the command (exit 2) before any work.
    recorded = logio.read_decisions(args.compare, kafka=kafka) if args.compare else None
    events = logio.read_events(args.log, on_bad=bad.append, kafka=kafka)
    install = install_of(args, key)
    if args.simulate:
        if len({e.get("cluster") or "default" for e in events}) > 1:
            raise UsageError("--simulate plays one cluster: split a multi-cluster trace by cluster")
        result = simulator.simulate(events, config)
        if key is not None:
            # The signature is outside the hash: signing afterwards gives the worker's bytes.
            for made in result.decisions:
                made["sig"] = chain.sign(key, made["hash"], install)
        if args.log_out:
            logio.write_jsonl(Path(args.log_out), result.log)
    else:
        progress = Progress(len(events), "replay")
        result = fleet.fold(events, config, key=key, progress=progress, install=install)
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
    if recorded is not None:
        diffs = compare(decisions, recorded)
        for line in diffs:
            print(line)
        print(f"{len(diffs)} decision(s) differ", file=sys.stderr)
        return 1 if diffs else 0
    return 0


def install_of(args: argparse.Namespace, key: bytes | None) -> str | None:
    """The install re-derived records are signed for: the worker's (its --install-id, default its
    topic prefix); None with --unbound-hmac (records of workers before installs were bound)."""
    if key is not None and chain.is_pem(key):
        try:
            chain.private_key(key)
        except chain.InvalidKey as exc:
            raise UsageError(f"--hmac-key-file {args.hmac_key_file}: {exc}") from exc
    if args.unbound_hmac:
        if key is None or chain.is_pem(key):
            raise UsageError("--unbound-hmac signs with an HMAC key (--hmac-key-file) only")
        if args.install_id is not None:
            raise UsageError("--unbound-hmac signs for no install: drop --install-id")
        return None
    install: str = args.install_id or chain.DEFAULT_INSTALL
    return install
