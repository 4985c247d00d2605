# RTX 6000 Ada 48GB in a Core i9-13900K workstation.
name = rtx6000-ada-desktop
kind = desktop

gpu.name = NVIDIA RTX 6000 Ada Generation
gpu.count = 1  # source: one GPU modelled
gpu.fp16_tensor = 364.2 TFLOP/s  # source: estimate, NVIDIA RTX 6000 Ada datasheet 1457 TFLOPS Tensor (FP8 with sparsity) / 4 for dense FP16
gpu.int8_tensor = 728.5 TOP/s  # source: estimate, NVIDIA RTX 6000 Ada datasheet 1457 TFLOPS (FP8 with sparsity) / 2 for dense INT8
gpu.fp32 = 91.1 TFLOP/s  # source: NVIDIA RTX 6000 Ada datasheet, single-precision
gpu.mem_bw = 960 GB/s  # source: NVIDIA RTX 6000 Ada datasheet, GDDR6 bandwidth
gpu.mem = 48 GiB  # source: NVIDIA RTX 6000 Ada datasheet "48GB" (binary)
gpu.launch = 5 us  # source: estimate, typical CUDA kernel launch cost; the calibration's gpu_op_cycles replaces it where the profile gives the clock
gpu.clock = 2505 MHz  # source: NVIDIA Ada GPU architecture whitepaper, RTX 6000 Ada boost clock
gpu.tdp = 300 W  # source: NVIDIA RTX 6000 Ada datasheet, max power consumption

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
