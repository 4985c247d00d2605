# GeForce RTX 5090 in a Core i9-13900K desktop (PCIe 5.0 x16 from the CPU).
name = rtx5090-desktop
kind = desktop

gpu.name = NVIDIA GeForce RTX 5090
gpu.count = 1  # source: one GPU modelled
gpu.fp16_tensor = 209.5 TFLOP/s  # source: estimate, NVIDIA RTX 5090 specifications 3352 AI TOPS (FP4 with sparsity) / 16: FP16 Tensor with FP32 accumulate, dense, at the GeForce half rate
gpu.int8_tensor = 838 TOP/s  # source: estimate, NVIDIA RTX 5090 specifications 3352 AI TOPS (FP4 with sparsity) / 4: INT8 Tensor, dense
gpu.fp32 = 104.8 TFLOP/s  # source: NVIDIA RTX 5090 specifications, 21760 CUDA cores x 2407 MHz boost x 2
gpu.mem_bw = 1792 GB/s  # source: NVIDIA RTX 5090 specifications, 32GB GDDR7 at 28 Gbps on 512 bits
gpu.mem = 32 GiB  # source: NVIDIA RTX 5090 specifications "32GB GDDR7" (binary)
gpu.launch = 5 us  # source: estimate, typical CUDA kernel launch cost; the calibration's gpu_op_cycles replaces it where the profile gives the clock
gpu.clock = 2407 MHz  # source: NVIDIA RTX 5090 specifications, boost clock
gpu.tdp = 575 W  # source: NVIDIA RTX 5090 specifications, total graphics power

link.name = PCIe 5.0 x16
link.h2d_bw = 63 GB/s  # source: PCIe 5.0 spec, 32 GT/s x 16 lanes, 128b/130b encoding, per direction (theoretical)
link.d2h_bw = 63 GB/s  # source: PCIe 5.0 spec, 32 GT/s x 16 lanes, 128b/130b encoding, as h2d, per direction (theoretical)
link.latency = 10 us  # source: estimate, a small cudaMemcpy over PCIe end to end

cpu.name = Intel Core i9-13900K (8 P-cores + 16 E-cores), dual-channel DDR5
cpu.sockets = 1  # source: estimate, a desktop with one Core i9-13900K
cpu.cores = 24  # source: Intel ARK, Core i9-13900K: 8 performance + 16 efficient cores
cpu.fp32 = 2.5 TFLOP/s  # source: estimate, 8 P-cores x 5.5 GHz x 32 FLOP/cycle + 16 E-cores x 4.3 GHz x 16 FLOP/cycle (AVX2 FMA)
cpu.mem_bw = 89.6 GB/s  # source: Intel ARK, Core i9-13900K: 2 channels DDR5-5600: 2 x 5600 MT/s x 8 B (theoretical)
cpu.mem = 64 GiB  # source: estimate, a typical desktop configuration (two 32 GB DDR5 DIMMs)
