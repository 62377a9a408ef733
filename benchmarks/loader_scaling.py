"""The torch loader across cores: one worker on one core against two workers
on a core each, side by side.

Writes JPEG shards of ImageNet-like photographs (as benchmarks/reader.py:
longer side 500 px, quality 90), then in interleaved rounds times the torch
loader (``make_loader(url, rank, 2, ...)``, training transforms, decoding on
the CPU with one decoding thread: the share of a worker with one core) in
processes of their own, each pinned to one core:

- single: rank 0 on core 0 alone, then rank 1 on core 0 alone (the ranks
          read different row groups, whose images decode at different
          costs: each rank is compared with itself);
- pair:   ranks 0 and 1 at once, on cores 0 and 1, started together (both
          wait, warmed up, for the same signal).

- wide:   rank 0 alone on cores 0 and 1, two decoding threads (one worker
          given two cores: ``loader_threads_scaling.torch``, its rate over
          twice rank 0's alone on one core).
- wide_processes: the same in two decoding processes
          (``make_loader(decode_processes=2)``: ``loader_processes_scaling.torch``,
          its rate over twice rank 0's alone on one core).

Each worker reports images/s and CPU seconds per wall second (its decoding
processes' included) over the same number of batches. Writes ``loader_scaling.torch`` (the pair's summed rate
over the sum of each rank's rate alone; goal 0.9) and
``loader_scaling_per_cpu_s.torch`` (the same ratio of images per
CPU-second) to results.json, with the decoder that ran.

    PYTHONPATH=src .venv-dbr-19-ml/bin/python benchmarks/loader_scaling.py
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def child(url: str, cores: str, rank: int, batches: int, warmup: int, batch_size: int,
          ready: str, go: str, parallelism: str = "threads") -> None:
    """One worker: pinned to ``cores`` ("0" or "0,1"), a decoding thread (or
    with ``parallelism="processes"`` a decoding process) per core; prints its
    figures."""
    pinned = {int(c) for c in cores.split(",")}
    os.sched_setaffinity(0, pinned)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from dist_dl.read import ReaderConfig, make_loader
    from dist_dl.read.imaging import decoder_name

    decoders = ({"decode_processes": len(pinned)} if parallelism == "processes"
                else {"threads": len(pinned)})
    loader = make_loader(url, rank, 2, batch_size, training=True,
                         config=ReaderConfig(image_size=224), seed=rank, **decoders)

    def forever():
        while True:
            yield from loader

    batches_of = forever()
    for _ in range(warmup):
        next(batches_of)
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    cpu0, t0 = _cpu_seconds(loader), time.perf_counter()
    for _ in range(batches):
        next(batches_of)
    wall, cpu = time.perf_counter() - t0, _cpu_seconds(loader) - cpu0
    print(json.dumps({"img_s": batches * batch_size / wall, "cpu_per_s": cpu / wall,
                      "per_cpu_s": batches * batch_size / cpu, "decoder": decoder_name()}))


def _cpu_seconds(loader) -> float:
    """CPU seconds of this process and of the loader's decoding processes."""
    import psutil

    return time.process_time() + sum(sum(psutil.Process(pid).cpu_times()[:2])
                                     for pid in loader.decode_pids)


def _run(url, cores, args, workdir, ranks=None, parallelism="threads") -> list[dict]:
    """Workers on ``cores`` (rank ``ranks[i]``, default i, on cores[i]: a core,
    or "0,1" for both) started together, decoding in ``parallelism``; their
    figures."""
    go = os.path.join(workdir, f"go-{time.monotonic_ns()}")
    procs, readies = [], []
    for rank, core in zip(ranks or range(len(cores)), cores):
        ready = f"{go}.ready{rank}"
        readies.append(ready)
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--child", url, str(core), str(rank), str(args.batches),
             str(args.warmup), str(args.batch_size), ready, go, parallelism],
            stdout=subprocess.PIPE, text=True))
    while not all(os.path.exists(r) for r in readies):
        if any(p.poll() not in (None, 0) for p in procs):
            raise RuntimeError("a worker failed before it was ready")
        time.sleep(0.01)
    open(go, "w").close()
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=1800)
        if p.returncode:
            raise RuntimeError(f"a worker exited with {p.returncode}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=48, help="timed batches per worker")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", default=os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "results.json"), help="results file ('' for none)")
    args = parser.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two cores")
    cores = sorted(os.sched_getaffinity(0))[:2]

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from max_side import make_photos

    from dist_dl.prepare.synthetic import write_image_shards

    workdir = tempfile.mkdtemp(prefix="dist_dl-bench-scaling-")
    url = os.path.join(workdir, "shards")
    write_image_shards(url, make_photos(args.rows, 500), [i % 10 for i in range(args.rows)],
                       10, mode="overwrite", source="photo", rows_per_row_group=64)
    rounds = []
    for r in range(args.rounds):
        # Alternate which goes first.
        order = ["single", "pair", "wide", "wide_processes"]
        order = order if r % 2 == 0 else order[::-1]
        row = {}
        for name in order:
            # "single": each rank alone on core 0, one after the other (the
            # ranks read different row groups, which decode at different
            # costs); "pair": both ranks at once; "wide": rank 0 alone on
            # both cores, with two decoding threads; "wide_processes": the
            # same with two decoding processes.
            if name == "single":
                found = [_run(url, cores[:1], args, workdir, [rank])[0] for rank in (0, 1)]
                row["single_rank0"] = found[0]["img_s"]
            elif name == "pair":
                found = _run(url, cores, args, workdir)
            else:
                found = _run(url, [",".join(map(str, cores))], args, workdir,
                             parallelism="processes" if name == "wide_processes" else "threads")
            row[name] = sum(f["img_s"] for f in found)
            row[name + "_per_cpu_s"] = sum(f["per_cpu_s"] for f in found)
            row[name + "_cpu_per_s"] = sum(f["cpu_per_s"] for f in found)
            row["decoder"] = found[0]["decoder"]
        row["ratio"] = row["pair"] / row["single"]
        row["ratio_per_cpu_s"] = row["pair_per_cpu_s"] / row["single_per_cpu_s"]
        row["wide_ratio"] = row["wide"] / (2 * row["single_rank0"])
        row["wide_processes_ratio"] = row["wide_processes"] / (2 * row["single_rank0"])
        rounds.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                          for k, v in row.items()}), flush=True)
    decoder = rounds[0]["decoder"]
    summary = {key: round(statistics.median(r[key] for r in rounds), 3)
               for key in ("single", "pair", "ratio", "single_per_cpu_s", "pair_per_cpu_s",
                           "ratio_per_cpu_s", "single_cpu_per_s", "pair_cpu_per_s",
                           "single_rank0", "wide", "wide_cpu_per_s", "wide_ratio",
                           "wide_processes", "wide_processes_cpu_per_s",
                           "wide_processes_ratio")}
    print(json.dumps(dict(summary, decoder=decoder), indent=1))
    if args.results:
        from dist_dl.app.bench import publish_results, result_entry

        common = dict(decoder=decoder, cores=2, batch_size=args.batch_size,
                      images_per_worker=args.batches * args.batch_size)
        published = publish_results(args.results, {
            "loader_scaling.torch": result_entry(
                [r["ratio"] for r in rounds], goal=0.9,
                single_images_per_second=summary["single"],  # the two ranks' alone, summed
                pair_images_per_second=summary["pair"], **common),
            "loader_scaling_per_cpu_s.torch": result_entry(
                [r["ratio_per_cpu_s"] for r in rounds], **common),
            "loader_threads_scaling.torch": result_entry(
                [r["wide_ratio"] for r in rounds], alone_images_per_second=summary["single_rank0"],
                wide_images_per_second=summary["wide"], wide_cores_busy=summary["wide_cpu_per_s"],
                **common),
            "loader_processes_scaling.torch": result_entry(
                [r["wide_processes_ratio"] for r in rounds],
                alone_images_per_second=summary["single_rank0"],
                wide_images_per_second=summary["wide_processes"],
                wide_cores_busy=summary["wide_processes_cpu_per_s"], **common)})
        print(f"results: {published['results']}")
    return summary


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        url, core, rank, batches, warmup, batch_size, ready, go, parallelism = sys.argv[2:]
        child(url, core, int(rank), int(batches), int(warmup), int(batch_size), ready, go,
              parallelism)
    else:
        main()
