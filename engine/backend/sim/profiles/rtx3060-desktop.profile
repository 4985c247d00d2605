# GeForce RTX 3060 12GB in a Core i9-13900K desktop.
name = rtx3060-desktop
kind = desktop

gpu.name = NVIDIA GeForce RTX 3060 12GB
gpu.count = 1  # source: one GPU modelled
gpu.fp16_tensor = 25.5 TFLOP/s  # source: estimate, 2 x the FP32 rate (GeForce Ampere: FP16 Tensor with FP32 accumulate, dense, as the GA102 whitepaper gives for the RTX 3080/3090)
gpu.int8_tensor = 102 TOP/s  # source: estimate, 8 x the FP32 rate (GeForce Ampere: INT8 Tensor, dense, as the GA102 whitepaper gives for the RTX 3080/3090)
gpu.fp32 = 12.74 TFLOP/s  # source: NVIDIA RTX 3060 specifications, 3584 CUDA cores x 1777 MHz boost x 2
gpu.mem_bw = 360 GB/s  # source: NVIDIA RTX 3060 specifications, 12GB GDDR6 at 15 Gbps on 192 bits
gpu.mem = 12 GiB  # source: NVIDIA RTX 3060 specifications "12GB GDDR6" (binary)
gpu.launch = 5 us  # source: estimate, typical CUDA kernel launch cost; the calibration's gpu_op_cycles replaces it where the profile gives the clock
gpu.clock = 1777 MHz  # source: NVIDIA RTX 3060 specifications, boost clock
gpu.tdp = 170 W  # source: NVIDIA RTX 3060 specifications, graphics card power

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
