"""Topic-matching benchmark: broker.routing.TopicIndex against the survey's algorithms.

    .venv/bin/python bench/matching.py            # full: 1k, 10k, 100k, 1M bindings (~10 min)
    .venv/bin/python bench/matching.py --quick    # 1k and 10k, fewer samples (< 1 min)
    .venv/bin/python bench/matching.py --json bench/results/matching.json --png FILE

Every (algorithm, size) runs in a fresh subprocess, so memory is measured from a clean heap and a
runaway comparator can be cut off. Times are CPU time of that process (CLOCK_PROCESS_CPUTIME_ID,
``time.process_time_ns``) rather than wall time because the benchmark machine is shared; batch
timings take the best of several repeats. Memory per binding is the deep size of the index
after building it (``sys.getsizeof`` over every object it reaches, plus a size model of each
pyroaring BitMap calibrated against VmRSS, see ``bitmap_bytes``), excluding the pattern strings,
destination objects and topic list that the caller owns (the VmRSS growth is also recorded,
as ``rss_bytes_per_binding`` in the JSON; it is coarse below ~100k bindings). Comparators whose
build would exceed the time budget are reported as skipped, with the projection that made them
so; slow lookups are sampled (the sample count is reported).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
import types
from itertools import accumulate
from pathlib import Path

from lib import RESULTS
from lib.comparators import InvertedBitmap, Naive, OptimizedInvertedBitmap, Trie
from lib.machine import machine_info
from lib.output import write_json
from pyroaring import BitMap

from roarmq.broker.routing import TopicIndex

ALGORITHMS = {
    "ours": "ours (trie + bitmap cache)",
    "trie": Trie.name,
    "optimized": OptimizedInvertedBitmap.name,
    "inverted": InvertedBitmap.name,
    "naive": Naive.name,
}
FULL_SIZES = (1_000, 10_000, 100_000, 1_000_000)
QUICK_SIZES = (1_000, 10_000)
CACHE_KEYS = 10_000

# -- workload ----------------------------------------------------------------------------------

LEVEL_VOCAB = (40, 1_000, 10_000, 20_000, 20_000, 20_000)  # words per level, Zipf-ranked
KEY_LENGTHS = {3: 0.35, 4: 0.30, 5: 0.20, 6: 0.15}
ZIPF_S = 1.0  # word popularity within a level, and key popularity in the traffic
WILDCARD_SHARE = 0.2
DISTINCT_KEYS = 16_000  # the routing keys the traffic uses; more than CACHE_KEYS, so it evicts


class Workload:
    """Keys of 3-6 words drawn per level from Zipf vocabularies; patterns are such keys, 20%
    of them turned into wildcards: one non-first word -> ``*`` (50%), a subtree ``a.b.#``
    dropping the last one or two words (30%), ``#.y.z`` (10%), ``a.b.#.z`` (10%). Traffic is
    Zipf over DISTINCT_KEYS distinct keys."""

    def __init__(self, seed: int = 1) -> None:
        self.seed = seed
        self.vocab = [[f"l{lv}w{r}" for r in range(v)] for lv, v in enumerate(LEVEL_VOCAB)]
        self.cum = [list(accumulate((r + 1) ** -ZIPF_S for r in range(v))) for v in LEVEL_VOCAB]

    def keys(self, n: int, rng: random.Random) -> list[str]:
        lengths = rng.choices(list(KEY_LENGTHS), weights=list(KEY_LENGTHS.values()), k=n)
        columns = [
            rng.choices(words, cum_weights=cum, k=n)
            for words, cum in zip(self.vocab, self.cum, strict=True)
        ]
        return [".".join(columns[lv][i] for lv in range(lengths[i])) for i in range(n)]

    def patterns(self, n: int, rng: random.Random) -> list[str]:
        out = []
        for key in self.keys(n, rng):
            if rng.random() >= WILDCARD_SHARE:
                out.append(key)
                continue
            w = key.split(".")
            r = rng.random()
            if r < 0.5:
                w[rng.randrange(1, len(w))] = "*"
            elif r < 0.8:
                w = w[: len(w) - rng.choice((1, 2))] + ["#"]
            elif r < 0.9:
                w = ["#"] + w[-2:]
            else:
                w = w[:2] + ["#"] + w[-1:]
            out.append(".".join(w))
        return out

    def traffic_pool(self) -> list[str]:
        rng = random.Random(self.seed * 7919)
        pool: dict[str, None] = {}
        while len(pool) < DISTINCT_KEYS:
            pool.update(dict.fromkeys(self.keys(DISTINCT_KEYS, rng)))
        return list(pool)[:DISTINCT_KEYS]

    def traffic(self, pool: list[str], n: int, seed: int) -> list[str]:
        cum = list(accumulate((r + 1) ** -ZIPF_S for r in range(len(pool))))
        return random.Random(seed).choices(pool, cum_weights=cum, k=n)


# -- measurement helpers -----------------------------------------------------------------------


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


clock = time.process_time_ns


def clock_overhead() -> int:
    return min(-(clock() - clock()) for _ in range(2000))


def per_call(fn, args: list, budget_s: float) -> tuple[float, int, list[int]]:
    """Mean ns of ``fn(arg)`` timed call by call, over as many args as fit in the budget."""
    overhead = clock_overhead()
    times: list[int] = []
    deadline = clock() + budget_s * 1e9
    for arg in args:
        t = clock()
        fn(arg)
        times.append(max(clock() - t - overhead, 0))
        if clock() > deadline:
            break
    return statistics.fmean(times), len(times), times


def batched(fn, args: list, repeats: int) -> float:
    """Best-of-``repeats`` mean ns per call of ``fn`` over ``args`` in one tight loop."""
    best = float("inf")
    for _ in range(repeats):
        t = clock()
        for a in args:
            fn(a)
        best = min(best, (clock() - t) / len(args))
    return best


# In-memory size of a pyroaring BitMap, which sys.getsizeof cannot see (CRoaring mallocs its own
# memory): ~100 bytes for the object and its roaring_bitmap_t, ~80 per container (key, typecode,
# pointer, container header, malloc overhead), plus the payload pyroaring's get_statistics()
# reports. Calibrated against VmRSS growth over 100k-bitmap allocations (1, 10, 100, 1000
# elements; 1-3000 containers); within ~15% of it.
BITMAP_BASE, BITMAP_PER_CONTAINER = 100, 80


def bitmap_bytes(bm: BitMap) -> int:
    st = bm.get_statistics()
    payload = (
        st["n_bytes_array_containers"]
        + st["n_bytes_run_containers"]
        + st["n_bytes_bitset_containers"]
    )
    return BITMAP_BASE + BITMAP_PER_CONTAINER * st["n_containers"] + payload


_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def deep_size(root: object, exclude: set[int]) -> int:
    """Bytes of every object reachable from ``root`` except those in ``exclude`` (by id):
    sys.getsizeof for Python objects (GC header included), bitmap_bytes for BitMaps."""
    seen = set(exclude)
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, _OPAQUE):
            continue
        if type(obj) is BitMap:
            total += bitmap_bytes(obj)
            continue
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def digest(result: set) -> str:
    return hashlib.blake2b(repr(sorted(result)).encode(), digest_size=6).hexdigest()


def pctl(times: list[int], q: float) -> float:
    s = sorted(times)
    return float(s[min(len(s) - 1, int(len(s) * q))])


# -- one (algorithm, size) run, in its own process ---------------------------------------------


def run_worker(alg: str, n: int, quick: bool) -> dict:
    wl = Workload()
    rng = random.Random(n)
    patterns = wl.patterns(n, rng)
    queues = [f"q{i}" for i in range(max(1, n // 4))]
    dests = [queues[rng.randrange(len(queues))] for _ in range(n)]
    pool = wl.traffic_pool()
    traffic = wl.traffic(pool, 20_000 if quick else 200_000, seed=n + 1)
    fresh = wl.patterns(500 if quick else 2000, random.Random(n + 2))
    fresh_dests = [queues[i % len(queues)] for i in range(len(fresh))]
    build_budget = 20.0 if quick else 240.0
    op_budget = 2.0 if quick else 15.0

    if alg == "ours":
        index = TopicIndex(cache_keys=CACHE_KEYS)
        subscribe, unsubscribe = index.bind, index.unbind
    else:
        index = {
            "trie": Trie,
            "optimized": OptimizedInvertedBitmap,
            "naive": Naive,
        }.get(alg, lambda: InvertedBitmap(pool))()
        subscribe, unsubscribe = index.subscribe, index.unsubscribe
    out: dict = {"algorithm": ALGORITHMS[alg], "key": alg, "bindings": n, "ops": {}}

    gc.collect()
    rss0 = rss()
    probe = min(n, 500 if alg == "inverted" else 5000)
    t0 = clock()
    for i in range(n):
        subscribe(patterns[i], dests[i])
        if i + 1 == probe and probe < n:
            projected = (clock() - t0) / 1e9 * n / probe
            if projected > build_budget:
                out["skipped"] = (
                    f"build projected at {projected:,.0f} s (> {build_budget:.0f} s budget) "
                    f"from {probe} subscribes at {(clock() - t0) / probe / 1e3:,.0f} us each"
                )
                return out
    out["ops"]["build"] = {"ns": (clock() - t0) / n, "samples": n}
    gc.collect()
    out["rss_bytes_per_binding"] = (rss() - rss0) / n
    # The pattern strings, destinations and the topic list belong to the caller.
    caller = {id(x) for x in (*patterns, *queues, *fresh, *pool, patterns, queues, pool)}
    index_bytes = deep_size(index, caller)
    out["bytes_per_binding"] = index_bytes / n

    if alg == "ours":
        # Cold: the first sight of each distinct key, in the order the traffic first shows it;
        # once CACHE_KEYS are cached a key goes in on its second miss (admission), evicting one.
        first_seen = list(dict.fromkeys(traffic + pool))
        cold_keys = first_seen[: 2000 if quick else len(first_seen)]
        mean, count, times = per_call(index.route, cold_keys, op_budget * 4)
        out["ops"]["lookup_cold"] = {
            "ns": mean,
            "samples": count,
            "p50": pctl(times, 0.5),
            "p99": pctl(times, 0.99),
        }
        # Steady state: replay the Zipf traffic so CLOCK keeps the popular keys, then count the
        # hits of one more replay, then time lookups of the keys that are cached.
        cache = index.cache.by_key
        for k in traffic:
            index.route(k)
        hits = 0
        for k in traffic:
            hits += k in cache
            index.route(k)
        out["hot_hit_rate"] = hits / len(traffic)
        hot = [k for k in traffic if k in cache]
        out["ops"]["lookup_hot"] = {"ns": batched(index.route, hot, 5), "samples": len(hot)}
        matched = [len(cache[k].ids) for k in hot]
        out["matched_bindings"] = statistics.fmean(matched) if matched else 0.0
        out["dests_per_lookup"] = statistics.fmean(len(index.route(k)) for k in hot[:20000])
        out["cache_bytes"] = deep_size(index, caller) - index_bytes
        out["cached_keys"] = len(cache)
    else:
        sample = traffic[: 5000 if quick else 20000]
        mean, count, _ = per_call(index.lookup, sample, op_budget)
        out["ops"]["lookup"] = {"ns": mean, "samples": count}
    digest_keys = traffic[: min(50, out["ops"].get("lookup", {"samples": 50})["samples"])]
    lookup = index.route if alg == "ours" else index.lookup
    out["digests"] = [digest(set(lookup(k))) for k in digest_keys]

    sub_mean, sub_count, sub_times = per_call(
        lambda i: subscribe(fresh[i], fresh_dests[i]), list(range(len(fresh))), op_budget
    )
    un_mean, un_count, un_times = per_call(
        lambda i: unsubscribe(fresh[i], fresh_dests[i]), list(range(sub_count)), op_budget
    )
    out["ops"]["subscribe"] = {
        "ns": sub_mean,
        "samples": sub_count,
        "p50": pctl(sub_times, 0.5),
        "p99": pctl(sub_times, 0.99),
    }
    out["ops"]["unsubscribe"] = {
        "ns": un_mean,
        "samples": un_count,
        "p50": pctl(un_times, 0.5),
        "p99": pctl(un_times, 0.99),
    }
    return out


# -- driver ------------------------------------------------------------------------------------


def machine_facts() -> dict:
    import pyroaring

    return machine_info(pyroaring=pyroaring.__version__, loadavg_start=os.getloadavg())


def spawn(alg: str, n: int, quick: bool, timeout: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", alg, str(n)]
    if quick:
        cmd.append("--quick")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {
            "algorithm": ALGORITHMS[alg],
            "key": alg,
            "bindings": n,
            "ops": {},
            "skipped": f"did not finish within {timeout:.0f} s",
        }
    if proc.returncode != 0:
        raise SystemExit(f"worker {alg} {n} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fmt_ns(ns: float | None) -> str:
    if ns is None:
        return "-"
    if ns >= 1e6:
        return f"{ns / 1e6:,.1f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:,.1f} us"
    return f"{ns:,.0f} ns"


def table(results: list[dict]) -> str:
    head = (
        "| algorithm | bindings | subscribe | unsubscribe | lookup | matched/lookup "
        "| bytes/binding |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    rows = [head]
    matched = {r["bindings"]: r.get("matched_bindings") for r in results if r["key"] == "ours"}
    for r in results:
        n = r["bindings"]
        if "skipped" in r:
            rows.append(f"| {r['algorithm']} | {n:,} | skipped ({r['skipped']}) | | | | |")
            continue
        ops = r["ops"]
        if r["key"] == "ours":
            lookup = (
                f"cold {fmt_ns(ops['lookup_cold']['ns'])} / hot {fmt_ns(ops['lookup_hot']['ns'])}"
            )
        else:
            s = ops["lookup"]["samples"]
            lookup = fmt_ns(ops["lookup"]["ns"]) + (f" (n={s})" if s < 1000 else "")
        m = matched.get(n)
        rows.append(
            f"| {r['algorithm']} | {n:,} | {fmt_ns(ops['subscribe']['ns'])} "
            f"| {fmt_ns(ops['unsubscribe']['ns'])} | {lookup} "
            f"| {'-' if m is None else f'{m:,.1f}'} | {r['bytes_per_binding']:,.0f} |"
        )
    return "\n".join(rows)


def json_rows(results: list[dict]) -> list[dict]:
    rows = []
    for r in results:
        base = {"algorithm": r["algorithm"], "bindings": r["bindings"]}
        if "skipped" in r:
            rows.append({**base, "op": None, "ns": None, "skipped": r["skipped"]})
            continue
        for op, v in r["ops"].items():
            rows.append(
                {
                    **base,
                    "op": op,
                    "ns": round(v["ns"], 1),
                    "samples": v["samples"],
                    **{k: v[k] for k in ("p50", "p99") if k in v},
                    "bytes_per_binding": round(r["bytes_per_binding"], 1),
                    "rss_bytes_per_binding": round(r["rss_bytes_per_binding"], 1),
                    **{
                        k: r[k]
                        for k in (
                            "matched_bindings",
                            "dests_per_lookup",
                            "cache_bytes",
                            "cached_keys",
                            "hot_hit_rate",
                        )
                        if k in r
                    },
                }
            )
    return rows


COLORS = {  # one colour per algorithm in every panel
    ALGORITHMS["ours"]: ("tab:red", "-"),
    "ours, cold": ("tab:red", "--"),
    "ours, hot (cached)": ("tab:red", "-"),
    ALGORITHMS["trie"]: ("tab:purple", "-"),
    ALGORITHMS["optimized"]: ("tab:green", "-"),
    ALGORITHMS["inverted"]: ("tab:blue", "-"),
    ALGORITHMS["naive"]: ("tab:orange", "-"),
}


def chart(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    panels = [
        ("lookup (ns)", ("lookup", "lookup_cold", "lookup_hot")),
        ("subscribe (ns)", ("subscribe",)),
        ("unsubscribe (ns)", ("unsubscribe",)),
        ("bytes per binding", ()),
    ]
    for ax, (title, ops) in zip(axes.flat, panels, strict=True):
        series: dict[str, list[tuple[int, float]]] = {}
        for r in results:
            if "skipped" in r:
                continue
            if not ops:
                series.setdefault(r["algorithm"], []).append(
                    (r["bindings"], r["bytes_per_binding"])
                )
                continue
            for op in ops:
                if op in r["ops"]:
                    label = {"lookup_cold": "ours, cold", "lookup_hot": "ours, hot (cached)"}.get(
                        op, r["algorithm"]
                    )
                    series.setdefault(label, []).append((r["bindings"], r["ops"][op]["ns"]))
        for label, pts in sorted(series.items()):
            pts.sort()
            style = COLORS.get(label, ("black", "-"))
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                color=style[0],
                linestyle=style[1],
                label=label,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("bindings")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Topic matching (CPU time per operation; lower is better)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1k and 10k bindings, < 1 minute")
    parser.add_argument("--json", type=Path, help="write result rows to this file")
    parser.add_argument("--png", type=Path, default=RESULTS / "matching.png", help="chart path")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--algorithms", type=lambda s: s.split(","), default=list(ALGORITHMS))
    parser.add_argument("--worker", nargs=2, metavar=("ALG", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        alg, n = args.worker[0], int(args.worker[1])
        print(json.dumps(run_worker(alg, n, args.quick)))
        return

    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    facts = machine_facts()
    started = time.monotonic()
    print(
        f"# {facts['cpu']}, nproc={facts['nproc']}, Python {facts['python']}, "
        f"pyroaring {facts['pyroaring']}, load {facts['loadavg_start']}",
        flush=True,
    )
    results = []
    for n in sizes:
        for alg in args.algorithms:
            r = spawn(alg, n, args.quick, timeout=60 if args.quick else 600)
            results.append(r)
            state = r.get("skipped") or ", ".join(
                f"{op} {fmt_ns(v['ns'])}" for op, v in r["ops"].items()
            )
            print(f"{r['algorithm']:>28} {n:>9,}: {state}", flush=True)
    facts["loadavg_end"] = os.getloadavg()
    facts["seconds"] = round(time.monotonic() - started, 1)

    for n in sizes:  # every algorithm must route the same traffic to the same destinations
        runs = [r for r in results if r["bindings"] == n and "digests" in r]
        for r in runs[1:]:
            k = min(len(r["digests"]), len(runs[0]["digests"]))
            if r["digests"][:k] != runs[0]["digests"][:k]:
                raise SystemExit(f"{r['algorithm']} disagrees with {runs[0]['algorithm']} at {n}")

    print()
    print(table(results))
    ours = [r for r in results if r["key"] == "ours" and "skipped" not in r]
    for r in ours:
        print(
            f"ours @ {r['bindings']:,}: cold p50 {fmt_ns(r['ops']['lookup_cold']['p50'])} "
            f"p99 {fmt_ns(r['ops']['lookup_cold']['p99'])}; subscribe p50 "
            f"{fmt_ns(r['ops']['subscribe']['p50'])} p99 {fmt_ns(r['ops']['subscribe']['p99'])}; "
            f"unsubscribe p50 {fmt_ns(r['ops']['unsubscribe']['p50'])} p99 "
            f"{fmt_ns(r['ops']['unsubscribe']['p99'])}; steady-state hit rate {r['hot_hit_rate']:.1%}; "
            f"{r['dests_per_lookup']:,.1f} destinations/lookup; cache {r['cached_keys']:,} keys "
            f"{r['cache_bytes'] / 2**20:,.1f} MiB"
        )
    print(
        f"\n{facts['seconds']} s; load average {facts['loadavg_start']} -> {facts['loadavg_end']}"
    )
    if args.json:
        write_json(args.json, {"machine": facts, "rows": json_rows(results)}, indent=1)
    chart(results, args.png)
    print(f"chart: {args.png}")


if __name__ == "__main__":
    main()
