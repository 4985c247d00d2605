#!/usr/bin/env python3
"""launch.py SRC.cu > OUT.cpp: a kernel file of engine/backend/cuda made
host C++ for the emulation (tests/cuda_emu): every launch
`k<<<grid, block[, smem, stream]>>>(args);` becomes
`emu_launch(grid, block, stream, [&] { k(args); });` (stream ignored),
the kernel's name with its template arguments when it has them
(`k<TT, 4><<<...>>>`)."""
import re
import sys


def split_top(text):
    out, depth, cur = [], 0, ''
    for ch in text:
        if ch in '([{':
            depth += 1
        elif ch in ')]}':
            depth -= 1
        if ch == ',' and depth == 0:
            out.append(cur)
            cur = ''
        else:
            cur += ch
    out.append(cur)
    return [x.strip() for x in out]


def launch(m):
    cfg = split_top(m.group(2)) + ['0', 'nullptr']
    return 'emu_launch((unsigned)(%s), (unsigned)(%s), (cudaStream_t)(%s), [&] { %s(%s); });' % (
        cfg[0], cfg[1], cfg[3], m.group(1), m.group(3))


src = open(sys.argv[1]).read()
out, n = re.subn(r'(\w+(?:<[^<>;()]*>)?)<<<(.*?)>>>\((.*?)\);', launch, src, flags=re.S)
if n == 0:
    sys.exit('launch.py: no kernel launch in ' + sys.argv[1])
sys.stdout.write(out)
