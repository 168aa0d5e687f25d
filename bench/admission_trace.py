"""Admission's decisions as a trace: seeded chaos on two pools' schedulers on a fake clock, one JSON line per
dispatch, refusal and revocation, then the rejection counts and the backends' accounting.

    .venv/bin/python -m bench.admission_trace --seed 3 --load heavy > after.txt   # then on another commit
    diff before.txt after.txt                                                     # empty: same decisions

For refactors that must not change behaviour: no processes, no wall clock, so two commits given the same
seed make the same decisions exactly when their admission logic is the same (a load benchmark's spread
hides a small change; this does not). Two pools (interactive on two backends, offline on one, lending on
with `max_load` 0.75, engine priorities on), the default policy,
tenants a/b/c at bands 0/5/10, streams and whole answers, first bytes, revocations queued again, cancels,
scrapes and a backend going down and up. `--load light` leaves room for loans; `heavy` (the default)
overloads the interactive pool.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from pathlib import Path
from typing import Any

from gateway.admission.lease import Lease
from gateway.admission.scheduler import PoolScheduler
from gateway.backends.state import BackendState
from gateway.livepolicy.policy import Policy, load_policy
from gateway.request.errors import ApiError
from gateway.request.ticket import Cost, Outcome, Ticket, Usage

ROOT = Path(__file__).resolve().parent.parent
STEPS = 1500


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _policy() -> Policy:
    p = load_policy(ROOT / "policies" / "default.yaml").model_dump(mode="json")
    p["controller"].update(initial=4, min=2, max=8)
    p["budgets"]["prefill_tokens_per_round"] = 2000
    p["budgets"]["pools"] = {"interactive": {"lend": {"enabled": True, "max_load": 0.75}}}
    p["queue"]["classes"]["interactive"].update(max_queue_depth=40, max_wait_s=3.0)
    p["queue"]["classes"]["offline"].update(max_queue_depth=60, max_wait_s=6.0)
    return Policy.model_validate(p)


async def trace(seed: int, light: bool) -> list[Any]:
    pol = _policy()
    clock = Clock()
    inter_b = [BackendState(url=f"http://i{i}", pool="interactive") for i in range(2)]
    off_b = [BackendState(url="http://o0", pool="offline")]
    inter = PoolScheduler("interactive", inter_b, lambda: pol.admission, clock=clock, engine_priorities=True)
    off = PoolScheduler("offline", off_b, lambda: pol.admission, clock=clock, engine_priorities=True)
    off.borrow_from(inter)
    rng = random.Random(seed)
    arrivals = [0] * 8 + [1] if light else [0, 0, 0, 0, 1, 1, 2]
    log: list[Any] = []
    ids = iter(range(1, 10**9))

    async def client(cls: str) -> None:
        sched = inter if cls == "interactive" else off
        t = Ticket(
            id=f"r{next(ids)}",
            model="m",
            stream=rng.random() < 0.6,
            arrival=clock.now,
            tenant=rng.choice(["a", "b", "c"]) if cls == "interactive" else "batch",
            pool=cls,
            traffic_class=cls,
            priority=rng.choice([0, 5, 5, 10]) if cls == "interactive" else 0,
            bucket=rng.choice(["text", "text", "single_image", "multi_image"]),
            cost=Cost(text_tokens=rng.randint(10, 1500), expected_output_tokens=rng.randint(0, 300)),
        )
        requeued = False
        while True:
            try:
                lease = await sched.acquire(t, requeued=requeued)
            except ApiError as e:
                log.append(("refused", t.id, str(e.code), round(clock.now, 6)))
                return
            log.append(
                ("go", t.id, lease.backend.url, lease.engine_priority, lease.loan, round(clock.now, 6))
            )
            if not await _serve(lease, t, rng, log, clock):
                return
            requeued = True

    tasks: list[asyncio.Task[None]] = []
    for step in range(STEPS):
        tasks += [asyncio.create_task(client("interactive")) for _ in range(rng.choice(arrivals))]
        if rng.random() < 0.3:
            tasks.append(asyncio.create_task(client("offline")))
        live = [task for task in tasks if not task.done()]
        if live and rng.random() < 0.02:  # a client hangs up, waiting or running
            rng.choice(live).cancel()
        if step % 50 == 0:  # a scrape: KV known
            for b in (*inter_b, *off_b):
                b.max_total_tokens = 60000
                b.used_tokens = rng.randint(0, 40000)
        if step % 300 == 150:
            inter_b[1].healthy = not inter_b[1].healthy
        clock.now += rng.choice([0.01, 0.02, 0.05])
        inter.pump()
        off.pump()
        for _ in range(3):
            await asyncio.sleep(0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    accounting = [(b.active, b.outstanding_tokens, b.reserved_kv_tokens) for b in (*inter_b, *off_b)]
    log.append(("end", sorted(inter.rejections.items()), sorted(off.rejections.items()), accounting))
    return log


async def _serve(lease: Lease, t: Ticket, rng: random.Random, log: list[Any], clock: Clock) -> bool:
    """Run the lease as a pipeline would (armed until its first byte); True when it was taken back."""
    taken: list[bool] = []
    if lease.revocable:
        lease.arm(lambda: taken.append(True))
    outcome = Outcome.CANCELLED
    try:
        for _ in range(rng.randint(1, 60)):
            await asyncio.sleep(0)
            if taken:
                break
            if rng.random() < 0.3:
                lease.disarm()
                lease.started()
        outcome = (
            Outcome.REVOKED if taken else rng.choice([Outcome.OK, Outcome.OK, Outcome.OK, Outcome.OVERLOADED])
        )
    finally:
        if outcome in (Outcome.REVOKED, Outcome.CANCELLED):
            if outcome == Outcome.REVOKED:
                log.append(("revoked", t.id, round(clock.now, 6)))
            lease.release(Usage(0, 0), outcome)
        else:
            ttft = t.cost.prompt_tokens / rng.uniform(4000, 20000)
            usage = Usage(t.cost.prompt_tokens, rng.randint(0, 300))
            lease.release(usage, outcome, ttft_s=ttft, tpot_s=rng.uniform(0.01, 0.09))
    return outcome == Outcome.REVOKED


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--load", choices=["heavy", "light"], default="heavy")
    args = ap.parse_args()
    for event in asyncio.run(trace(args.seed, args.load == "light")):
        print(json.dumps(event))


if __name__ == "__main__":
    main()
