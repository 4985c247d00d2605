#!/usr/bin/env python3
"""Compare the running perplexity after every chunk of a `qinfer ppl` log
(stderr lines "[k/N] ppl X") with a llama-perplexity row of ppl.tsv.

    compare_running.py QINFER_LOG tests/golden/MODEL/ppl.tsv CTX [RUN]

Prints how many chunks agree to the 4 printed decimals, the largest
difference, and both final figures; exits 1 when any chunk differs.
"""
import re
import sys


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    log, tsv, ctx = sys.argv[1], sys.argv[2], int(sys.argv[3])
    run = sys.argv[4] if len(sys.argv) > 4 else "full"
    ours = {}
    final = None
    with open(log, errors="replace") as f:
        for line in f:
            m = re.match(r"\[(\d+)/(\d+)\] ppl ([0-9.]+)", line)
            if m:
                ours[int(m.group(1))] = float(m.group(3))
            m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", line)
            if m:
                final = (float(m.group(1)), float(m.group(2)))
    theirs, their_final = {}, None
    with open(tsv) as f:
        for line in f:
            if line.startswith("#"):
                continue
            col = line.rstrip("\n").split("\t")
            if len(col) >= 8 and col[0] == run and int(col[1]) == ctx:
                their_final = (float(col[5]), float(col[6]))
                for kv in col[7].split():
                    k, v = kv.split(":")
                    theirs[int(k)] = float(v)
    if not theirs:
        sys.exit("compare_running.py: no run '%s' at ctx %d in %s" % (run, ctx, tsv))
    common = sorted(set(ours) & set(theirs))
    diff = [abs(ours[k] - theirs[k]) for k in common]
    same = sum(1 for d in diff if d < 5e-5)
    print("ctx %d: %d chunks in both, %d agree to 4 decimals, max |diff| %.4f" % (ctx, len(common), same, max(diff)))
    print("final: qinfer %s, llama.cpp %.4f +/- %.5f" % (
        "%.4f +/- %.5f" % final if final else "(not finished)", their_final[0], their_final[1]))
    sys.exit(0 if same == len(common) else 1)


if __name__ == "__main__":
    main()
