# GeForce RTX 3090 in a Core i9-13900K desktop.
name = rtx3090-desktop
kind = desktop

gpu.name = NVIDIA GeForce RTX 3090
gpu.count = 1  # source: one GPU modelled
gpu.fp16_tensor = 71 TFLOP/s  # source: NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3090, FP16 Tensor with FP32 accumulate, dense (142 with FP16 accumulate)
gpu.int8_tensor = 284 TOP/s  # source: NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3090, INT8 Tensor, dense (568 with sparsity)
gpu.fp32 = 35.6 TFLOP/s  # source: NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3090, FP32
gpu.mem_bw = 936 GB/s  # source: NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3090, 24GB GDDR6X at 19.5 Gbps on 384 bits
gpu.mem = 24 GiB  # source: NVIDIA RTX 3090 specifications "24GB GDDR6X" (binary)
gpu.launch = 5 us  # source: estimate, typical CUDA kernel launch cost; the calibration's gpu_op_cycles replaces it where the profile gives the clock
gpu.clock = 1695 MHz  # source: NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3090 boost clock
gpu.tdp = 350 W  # source: NVIDIA RTX 3090 specifications, graphics card power

link.name = PCIe 4.0 x16
link.h2d_bw = 31.5 GB/s  # source: PCIe 4.0 spec, 16 GT/s x 16 lanes, 128b/130b encoding, per direction (theoretical; about 25 GB/s is achieved)
link.d2h_bw = 31.5 GB/s  # source: PCIe 4.0 spec, 16 GT/s x 16 lanes, 128b/130b encoding, as h2d, per direction (theoretical; about 25 GB/s is achieved)
link.latency = 10 us  # source: estimate, a small cudaMemcpy over PCIe end to end

cpu.name = Intel Core i9-13900K (8 P-cores + 16 E-cores), dual-channel DDR5
cpu.sockets = 1  # source: estimate, a desktop with one Core i9-13900K
cpu.cores = 24  # source: Intel ARK, Core i9-13900K: 8 performance + 16 efficient cores
cpu.fp32 = 2.5 TFLOP/s  # source: estimate, 8 P-cores x 5.5 GHz x 32 FLOP/cycle + 16 E-cores x 4.3 GHz x 16 FLOP/cycle (AVX2 FMA)
cpu.mem_bw = 89.6 GB/s  # source: Intel ARK, Core i9-13900K: 2 channels DDR5-5600: 2 x 5600 MT/s x 8 B (theoretical)
cpu.mem = 64 GiB  # source: estimate, a typical desktop configuration (two 32 GB DDR5 DIMMs)
