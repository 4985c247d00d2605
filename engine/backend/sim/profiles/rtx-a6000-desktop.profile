# RTX A6000 48GB in a Core i9-13900K workstation.
name = rtx-a6000-desktop
kind = desktop

gpu.name = NVIDIA RTX A6000
gpu.count = 1  # source: one GPU modelled
gpu.fp16_tensor = 154.8 TFLOP/s  # source: estimate, NVIDIA RTX A6000 datasheet 309.7 TFLOPS Tensor (with sparsity), halved for dense
gpu.int8_tensor = 309.7 TOP/s  # source: estimate, twice the dense FP16 tensor rate (Ampere INT8 Tensor Core; the datasheet gives no INT8 figure)
gpu.fp32 = 38.7 TFLOP/s  # source: NVIDIA RTX A6000 datasheet, single-precision
gpu.mem_bw = 768 GB/s  # source: NVIDIA RTX A6000 datasheet, GDDR6 bandwidth
gpu.mem = 48 GiB  # source: NVIDIA RTX A6000 datasheet "48GB" (binary)
gpu.launch = 5 us  # source: estimate, typical CUDA kernel launch cost; the calibration's gpu_op_cycles replaces it where the profile gives the clock
gpu.clock = 1800 MHz  # source: NVIDIA Ampere GA102 GPU architecture whitepaper, RTX A6000 boost clock
gpu.tdp = 300 W  # source: NVIDIA RTX A6000 datasheet, max power consumption

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
