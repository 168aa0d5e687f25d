"""Soak benchmark: does a gateway under moderate, misbehaving load for a long time stay flat?

    .venv/bin/python -m bench.soak                     # 10 minutes
    .venv/bin/python -m bench.soak --duration 60 --check

One `omnigate serve` (SQLite store, access log on, as deployed) in front of two simulated SGLang engines;
three tenants' clients send text and image chats, streamed and whole, and leave at random points
(`bench/ledger.py`'s fates), while the engines fail or cut one request in ten every other minute. Every
`--sample` seconds it reads the gateway process's resident memory (`VmRSS`) and open file descriptors
from /proc. After the run: the memory at the end of the warm-up (the first fifth of the run) against the
highest seen after it, the descriptors likewise, and the counters once the load stops (queue, slots,
outbox, the engines' running requests). Targets: memory growth after warm-up < 10 %, descriptors flat
(within a few: keep-alive connections come and go), every counter zero. `--check` exits 1 when one is
missed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from bench.common.servers import Procs, free_port, wait_http
from bench.ledger import ADMIN, MODEL, TENANTS, Tally, settled, start_sims, tenant_load

FD_SLACK = 16  # descriptors that may come and go with keep-alive connections and the engines' health checks


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _faults(sims: list[str], deadline: float, period: float) -> None:
    """Engine faults on for one period, off for the next, until the deadline."""
    on = False
    async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
        while time.monotonic() < deadline:
            await asyncio.sleep(min(period, max(0.0, deadline - time.monotonic())))
            on = not on and time.monotonic() < deadline
            rate = 0.1 if on else 0.0
            for sim in sims:
                await client.post(sim + "/admin/faults", json={"error_rate": rate, "disconnect_rate": rate})


async def _sampler(pid: int, deadline: float, every: float, samples: list[tuple[float, int, int]]) -> None:
    start = time.monotonic()
    while time.monotonic() < deadline:
        samples.append((time.monotonic() - start, _rss_kib(pid), _fds(pid)))
        await asyncio.sleep(every)


async def main_async(args: argparse.Namespace) -> bool:
    with tempfile.TemporaryDirectory(prefix="omnigate-soak-") as tmp:
        procs = Procs(Path(tmp))
        try:
            sims = start_sims(args, procs, "soak")
            port = free_port()
            work = Path(tmp)
            (work / "policy.yaml").write_text("version: 1\n")
            config = {
                "listen": {"host": "127.0.0.1", "port": port},
                "policy_path": str(work / "policy.yaml"),
                "watch_policy": False,
                "admin": {"token": ADMIN},
                "auth": {"required": True},
                "store": {"kind": "sqlite", "path": str(work / "tenants.sqlite3")},
                "access_log": True,
                "tenants": [{"id": t, "keys": [f"og-bench-{t}-key-0123456789"]} for t in TENANTS],
                "pools": [{"name": "interactive", "models": [MODEL], "backends": sims}],
            }
            (work / "gw.yaml").write_bytes(orjson.dumps(config))
            argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(work / "gw.yaml")]
            gw = procs.start("gateway", argv)
            wait_http(port, "/readyz", 60, procs, "gateway")
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + args.duration
            samples: list[tuple[float, int, int]] = []
            tallies = {t: Tally() for t in TENANTS}
            await asyncio.gather(
                _sampler(gw.pid, deadline, args.sample, samples),
                _faults(sims, deadline, max(args.duration / 10, 5.0)),
                *(
                    tenant_load(url, t, deadline, args.clients, 7 + i, tallies[t])
                    for i, t in enumerate(TENANTS)
                ),
            )
            counters = await settled(url, sims)
            samples.append((args.duration, _rss_kib(gw.pid), _fds(gw.pid)))
        finally:
            procs.close()
    warm = [s for s in samples if s[0] >= args.duration * 0.2]
    base_rss, base_fds = warm[0][1], warm[0][2]
    peak_rss, peak_fds = max(s[1] for s in warm), max(s[2] for s in warm)
    growth = (peak_rss - base_rss) / base_rss
    sent = sum(t.sent for t in tallies.values())
    print(f"soak: {args.duration:g} s, {sent} requests, {len(samples)} samples", flush=True)
    print(f"{'t (s)':>7} {'RSS MiB':>8} {'fds':>5}")
    step = max(1, len(samples) // 12)
    for t, rss, fds in samples[::step]:
        print(f"{t:>7.0f} {rss / 1024:>8.1f} {fds:>5}")
    rss_ok, fds_ok = growth < 0.10, peak_fds - base_fds <= FD_SLACK
    zero = not any(counters.values())
    print(
        f"memory after warm-up: {base_rss / 1024:.1f} → peak {peak_rss / 1024:.1f} MiB ({growth:+.1%}): "
        f"{'ok' if rss_ok else 'MISSED'} (< 10 %)"
    )
    print(f"descriptors: {base_fds} → peak {peak_fds}: {'ok' if fds_ok else 'MISSED'} (≤ +{FD_SLACK})")
    print(
        "counters at the end: "
        + ", ".join(f"{k} {v:g}" for k, v in counters.items())
        + (": ok" if zero else ": MISSED")
    )
    return rss_ok and fds_ok and zero


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--clients", type=int, default=3, help="concurrent clients per tenant")
    p.add_argument("--time-scale", type=float, default=5.0, help="engines run this much faster than a GPU")
    p.add_argument("--sample", type=float, default=5.0, help="seconds between memory samples")
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = p.parse_args()
    ok = asyncio.run(main_async(args))
    if args.check and not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
