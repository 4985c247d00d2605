# This host, measured by `qinfer sysinfo --profile-out`: achieved rates
# on a possibly busy machine, not datasheet peaks.
name = epyc-2core-kvm
kind = cpu-only

cpu.name = AMD EPYC
cpu.sockets = 1  # source: measured: qinfer sysinfo --profile-out, 2026-12-01, AMD EPYC, load average 0.4 (/proc/cpuinfo physical ids)
cpu.cores = 2  # source: measured: qinfer sysinfo --profile-out, 2026-12-01, AMD EPYC, load average 0.4 (physical cores)
cpu.fp32 = 172.62 GFLOP/s  # source: measured: qinfer sysinfo --profile-out, 2026-12-01, AMD EPYC, load average 0.4 (2 threads, 8-wide FMA chains, best of 3)
cpu.mem_bw = 17.37 GB/s  # source: measured: qinfer sysinfo --profile-out, 2026-12-01, AMD EPYC, load average 0.4 (read of 512 MiB, 2 threads, best of 3)
cpu.mem = 23.54 GiB  # source: measured: qinfer sysinfo --profile-out, 2026-12-01, AMD EPYC, load average 0.4 (physical pages)
