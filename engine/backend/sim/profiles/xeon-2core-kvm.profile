# This host, measured by `qinfer sysinfo --profile-out`: achieved rates
# on a possibly busy machine, not datasheet peaks.
name = xeon-2core-kvm
kind = cpu-only

cpu.name = Intel(R) Xeon(R) Processor
cpu.sockets = 1  # source: measured: qinfer sysinfo --profile-out, 2026-12-07, Intel(R) Xeon(R) Processor, load average 1.3 (/proc/cpuinfo physical ids)
cpu.cores = 2  # source: measured: qinfer sysinfo --profile-out, 2026-12-07, Intel(R) Xeon(R) Processor, load average 1.3 (physical cores)
cpu.fp32 = 197.44 GFLOP/s  # source: measured: qinfer sysinfo --profile-out, 2026-12-07, Intel(R) Xeon(R) Processor, load average 1.3 (2 threads, 8-wide FMA chains, best of 3)
cpu.mem_bw = 17.40 GB/s  # source: measured: qinfer sysinfo --profile-out, 2026-12-07, Intel(R) Xeon(R) Processor, load average 1.3 (read of 960 MiB, 2 threads, best of 3)
cpu.mem = 23.54 GiB  # source: measured: qinfer sysinfo --profile-out, 2026-12-07, Intel(R) Xeon(R) Processor, load average 1.3 (physical pages)
cpu.llc = 480.00 MiB  # source: measured: qinfer sysinfo --profile-out, 2026-12-07, Intel(R) Xeon(R) Processor, load average 1.3 (/sys/devices/system/cpu/cpu0/cache, the last level)
cpu.llc_bw = 32.83 GB/s  # source: measured: qinfer sysinfo --profile-out, 2026-12-07, Intel(R) Xeon(R) Processor, load average 1.3 (read of 16 MiB, 2 threads, best of 20)
