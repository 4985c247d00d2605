# V100 SXM2 32GB with the host of a DGX-1 (two Broadwell sockets); its link the host's PCIe Gen3 switch.
name = v100-sxm2-dgx1
kind = server

gpu.name = NVIDIA Tesla V100 SXM2 32GB
gpu.count = 1  # source: one GPU modelled
gpu.fp16_tensor = 125 TFLOP/s  # source: NVIDIA V100 datasheet, SXM2, Tensor Performance (FP16 in, FP32 accumulate)
gpu.int8_tensor = 62.8 TOP/s  # source: estimate, no INT8 Tensor Cores: the dp4a rate, 4 x the FP32 rate
gpu.fp32 = 15.7 TFLOP/s  # source: NVIDIA V100 datasheet, SXM2, single-precision
gpu.mem_bw = 900 GB/s  # source: NVIDIA V100 datasheet, HBM2 bandwidth
gpu.mem = 32 GiB  # source: NVIDIA V100 datasheet "32GB" (binary)
gpu.launch = 5 us  # source: estimate, typical CUDA kernel launch cost; the calibration's gpu_op_cycles replaces it where the profile gives the clock
gpu.clock = 1530 MHz  # source: NVIDIA Tesla V100 GPU architecture whitepaper, SXM2 boost clock
gpu.tdp = 300 W  # source: NVIDIA V100 datasheet, SXM2, max power consumption

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
