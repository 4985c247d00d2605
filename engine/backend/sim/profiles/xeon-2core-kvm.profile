# This host, measured by `qinfer sysinfo --profile-out` on a shared machine: each
# rate the best of several probes the same day (load averages in the sources), not datasheet peaks.
name = xeon-2core-kvm
kind = cpu-only

cpu.name = Intel(R) Xeon(R) Processor
cpu.sockets = 1  # source: measured: qinfer sysinfo --profile-out, 2026-12-07, Intel(R) Xeon(R) Processor, load average 15.6 (/proc/cpuinfo physical ids)
cpu.cores = 2  # source: measured: qinfer sysinfo --profile-out, 2026-12-07, Intel(R) Xeon(R) Processor, load average 15.6 (physical cores)
cpu.fp32 = 85.40 GFLOP/s  # source: measured: qinfer sysinfo --profile-out, 2026-12-07, Intel(R) Xeon(R) Processor, load average 10.6 (2 threads, 8-wide FMA chains, best of 3; the best of 16 probes this day)
cpu.mem_bw = 9.18 GB/s  # source: measured: qinfer sysinfo --profile-out, 2026-12-07, Intel(R) Xeon(R) Processor, load average 9.1 (read of 960 MiB, 2 threads, best of 3; the best of 16 probes this day)
cpu.mem = 23.54 GiB  # source: measured: qinfer sysinfo --profile-out, 2026-12-07, Intel(R) Xeon(R) Processor, load average 15.6 (physical pages)
cpu.llc = 480.00 MiB  # source: measured: qinfer sysinfo --profile-out, 2026-12-07, Intel(R) Xeon(R) Processor, load average 15.6 (/sys/devices/system/cpu/cpu0/cache, the last level)
cpu.llc_bw = 35.57 GB/s  # source: measured: qinfer sysinfo --profile-out, 2026-12-07, Intel(R) Xeon(R) Processor, load average 10.6 (read of 16 MiB, 2 threads, best of 20; the best of 16 probes this day)
