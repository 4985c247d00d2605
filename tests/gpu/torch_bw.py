"""torch_bw.py - the probe's copies measured again through PyTorch.

An independent figure for `qinfer sysinfo --probe` to be read against: the
same sizes, repetitions and conventions (median GB/s, 1 GB = 1e9 bytes;
host<->device bytes counted once, device-to-device read + write), timed
with CUDA events around tensor copies, which PyTorch issues as
cudaMemcpyAsync. Prints the figures and, when $OUT/probe.txt holds the
probe's output, the ratio probe / torch for each. Information only: it
exits non-zero only when it cannot measure at all.
"""
import os
import re
import sys

import torch

HD_BYTES = 256 << 20
DD_BYTES = 1 << 30
REPS_HD = 11
REPS_DD = 21


def median_gbs(dst, src, reps, counted_bytes):
    dst.copy_(src)  # warm-up
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    rates = []
    for _ in range(reps):
        t0.record()
        dst.copy_(src, non_blocking=True)
        t1.record()
        t1.synchronize()
        rates.append(counted_bytes / (t0.elapsed_time(t1) * 1e-3) / 1e9)
    rates.sort()
    return rates[len(rates) // 2]


def main():
    if not torch.cuda.is_available():
        print("torch_bw: torch sees no CUDA device")
        return 1
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
    dev = torch.device("cuda:0")
    d_a = torch.empty(DD_BYTES, dtype=torch.uint8, device=dev).fill_(1)
    d_b = torch.empty(DD_BYTES, dtype=torch.uint8, device=dev).fill_(2)
    d_hd = d_a[:HD_BYTES]
    pinned = torch.full((HD_BYTES,), 3, dtype=torch.uint8).pin_memory()
    pageable = torch.full((HD_BYTES,), 4, dtype=torch.uint8)
    got = {
        ("h2d", "pinned"): median_gbs(d_hd, pinned, REPS_HD, HD_BYTES),
        ("d2h", "pinned"): median_gbs(pinned, d_hd, REPS_HD, HD_BYTES),
        ("h2d", "pageable"): median_gbs(d_hd, pageable, REPS_HD, HD_BYTES),
        ("d2h", "pageable"): median_gbs(pageable, d_hd, REPS_HD, HD_BYTES),
        ("d2d", ""): median_gbs(d_b, d_a, REPS_DD, 2 * DD_BYTES),
    }
    probe = {}
    path = os.path.join(os.environ.get("OUT", "."), "probe.txt")
    if os.path.exists(path):
        text = open(path).read()
        for (k, kind) in got:
            pat = rf"^{k}:.*?{kind} ([0-9.]+) GB/s" if kind else rf"^{k}: *([0-9.]+) GB/s"
            m = re.search(pat, text, re.M)
            if m:
                probe[(k, kind)] = float(m.group(1))
    for key, v in got.items():
        name = " ".join(x for x in key if x)
        line = f"torch {name:13s} {v:8.1f} GB/s"
        if key in probe:
            line += f"   probe {probe[key]:8.1f} GB/s   probe/torch {probe[key] / v:.2f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
