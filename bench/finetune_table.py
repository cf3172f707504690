"""The tables of bench/finetune.sh from its output folder (Markdown on stdout).

    python bench/finetune_table.py OUT --seeds 0 1 2 --arms scratch repeat mean

Reads, for each seed and arm, the evaluations of OUT/runs/seed{s}-{arm}-e0 (epoch 0: the
network the arm starts from) and OUT/runs/seed{s}-{arm} (checkpointNNNN is written after NNNN+1
epochs) and the trainer's epoch times from OUT/logs/seed{s}-{arm}.log. "To reach" pairs each
fine-tuned run with the scratch run of the same seed: the first epoch whose score is at least
scratch's score after its last epoch, and the sum of that run's own epoch times up to it.
"""
import argparse
import glob
import json
import os
import re
import statistics

EPOCH_TIME = re.compile(r"^Epoch: \[(\d+)/\d+\] Total time: ([0-9.]+)s", re.M)


def evaluations(run_dir, trained):
    """{epochs trained: (20-NN top-1 %, probe top-1 %)} of one run folder; trained = False: the
    one-step run at lr 0, epoch 0."""
    out = {}
    for path in glob.glob(os.path.join(run_dir, "*_analyses", "evaluation", "*_evaluation.json")):
        # A trained run's tags are epoch{E} (after epoch E, from 0); the one-step run's is
        # step1 (tagged epoch0 before the trainer gave mid-epoch checkpoints tags of their own).
        m = re.search(r"(epoch|step)(\d+)_evaluation\.json$", path)
        if not m or (trained and m.group(1) != "epoch"):
            continue
        e = json.load(open(path))
        knn = {k["k"]: k["scores"]["top1_percent"] for k in e["knn"]}
        epoch = int(m.group(2)) + 1 if trained else 0
        out[epoch] = (knn[20], e["linear_probe"]["scores"]["top1_percent"])
    return out


def epoch_times(log):
    """[seconds of epoch 1, epoch 2, ...] as the trainer logged them."""
    if not os.path.exists(log):
        return []
    found = {int(e): float(s) for e, s in EPOCH_TIME.findall(open(log).read())}
    return [found[e] for e in sorted(found)]


def cell(vals, fmt="{:.1f}"):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "–"
    if len(vals) == 1:
        return fmt.format(vals[0])
    return (fmt + " ± " + fmt).format(statistics.mean(vals), statistics.stdev(vals))


def reach(scores, times, goal, which):
    """(epochs, seconds) until scores[e][which] >= goal, or (None, None)."""
    for e in sorted(scores):
        if scores[e][which] >= goal:
            return e, sum(times[:e])
    return None, None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--seeds", nargs="+", required=True)
    p.add_argument("--arms", nargs="+", required=True)
    a = p.parse_args()
    runs = os.path.join(a.out, "runs")

    src = evaluations(os.path.join(runs, "source"), True)
    src_t = epoch_times(os.path.join(a.out, "logs", "source.log"))
    if src:
        last = max(src)
        print(f"Source (16 px, 3 channels, its own Test folder) after {last} epochs: 20-NN "
              f"{src[last][0]:.1f} %, probe {src[last][1]:.1f} %; first epoch 20-NN "
              f"{src[min(src)][0]:.1f} %; training {sum(src_t):.0f} s (epoch times summed)\n")

    scores, times = {}, {}
    for s in a.seeds:
        for arm in a.arms:
            r = evaluations(os.path.join(runs, f"seed{s}-{arm}-e0"), False)
            r.update(evaluations(os.path.join(runs, f"seed{s}-{arm}"), True))
            scores[s, arm] = r
            times[s, arm] = epoch_times(os.path.join(a.out, "logs", f"seed{s}-{arm}.log"))
    epochs = sorted({e for r in scores.values() for e in r})

    print(f"Target (12 px, 4 channels): top-1 % on its Test folder, mean ± sample standard deviation "
          f"over seeds {', '.join(a.seeds)}; epoch 0 is the network each arm starts from.\n")
    print("| epochs trained | " + " | ".join(f"{arm}: 20-NN" for arm in a.arms) + " | "
          + " | ".join(f"{arm}: probe" for arm in a.arms) + " |")
    print("|---|" + "---|" * (2 * len(a.arms)))
    for e in epochs:
        row = [cell([scores[s, arm].get(e, (None,))[0] for s in a.seeds]) for arm in a.arms]
        row += [cell([scores[s, arm].get(e, (None, None))[1] for s in a.seeds]) for arm in a.arms]
        print(f"| {e} | " + " | ".join(row) + " |")

    print("\nTo reach scratch's score after its last epoch (same seed), per seed "
          f"({', '.join(a.seeds)}); seconds: the run's own epoch times summed; – not reached.\n")
    print("| arm | s / epoch | 20-NN: epochs | 20-NN: s | probe: epochs | probe: s |")
    print("|---|---|---|---|---|---|")
    for arm in a.arms:
        row = [cell([statistics.mean(times[s, arm]) for s in a.seeds if times[s, arm]], "{:.0f}")]
        for which in (0, 1):
            got = []
            for s in a.seeds:
                sc = scores.get((s, "scratch"), {})
                if not sc or not scores[s, arm]:
                    got.append((None, None))
                    continue
                goal = sc[max(sc)][which]
                got.append(reach(scores[s, arm], times[s, arm], goal, which))
            row.append(", ".join("–" if e is None else str(e) for e, _ in got))
            row.append(", ".join("–" if t is None else f"{t:.0f}" for _, t in got))
        print(f"| {arm} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
