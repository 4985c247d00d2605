# Tesla P40 24GB in a two-socket Broadwell server.
name = p40
kind = server

gpu.name = NVIDIA Tesla P40 24GB
gpu.count = 1  # source: one GPU modelled
gpu.fp16_tensor = 11.76 TFLOP/s  # source: estimate, no Tensor Cores and FP16 at 1/64 rate: the FP32 rate stands in (GEMMs run in FP32)
gpu.int8_tensor = 47 TOP/s  # source: NVIDIA Tesla P40 datasheet, INT8 TOPS (the dp4a rate; no Tensor Cores)
gpu.fp32 = 11.76 TFLOP/s  # source: NVIDIA Tesla P40 datasheet, 12 TFLOPS single-precision (3840 cores x 1531 MHz x 2 = 11.76)
gpu.mem_bw = 346 GB/s  # source: NVIDIA Tesla P40 datasheet, GDDR5 bandwidth
gpu.mem = 24 GiB  # source: NVIDIA Tesla P40 datasheet "24GB" (binary)
gpu.launch = 5 us  # source: estimate, typical CUDA kernel launch cost; the calibration's gpu_op_cycles replaces it where the profile gives the clock
gpu.clock = 1531 MHz  # source: NVIDIA Tesla P40 datasheet, boost clock
gpu.tdp = 250 W  # source: NVIDIA Tesla P40 datasheet, max power

link.name = PCIe 3.0 x16
link.h2d_bw = 15.75 GB/s  # source: PCIe 3.0 spec, 8 GT/s x 16 lanes, 128b/130b encoding, per direction (theoretical)
link.d2h_bw = 15.75 GB/s  # source: PCIe 3.0 spec, 8 GT/s x 16 lanes, 128b/130b encoding, as h2d, per direction (theoretical)
link.latency = 10 us  # source: estimate, a small cudaMemcpy over PCIe end to end

cpu.name = 2x Intel Xeon E5-2698 v4 (Broadwell, the DGX-1 host)
cpu.sockets = 2  # source: NVIDIA DGX-1 datasheet, dual 20-core Intel Xeon E5-2698 v4
cpu.cores = 40  # source: Intel ARK, Xeon E5-2698 v4: 20 cores per socket
cpu.fp32 = 2.82 TFLOP/s  # source: estimate, 40 cores x 2.2 GHz base x 32 FLOP/cycle (two AVX2 FMA units)
cpu.mem_bw = 153.6 GB/s  # source: Intel ARK, Xeon E5-2698 v4: 4 channels DDR4-2400 per socket: 2 x 4 x 2400 MT/s x 8 B (theoretical)
cpu.mem = 512 GiB  # source: NVIDIA DGX-1 datasheet, 512 GB system memory
