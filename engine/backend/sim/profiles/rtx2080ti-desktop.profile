# GeForce RTX 2080 Ti in a Core i9-13900K desktop (the card is PCIe 3.0).
name = rtx2080ti-desktop
kind = desktop

gpu.name = NVIDIA GeForce RTX 2080 Ti
gpu.count = 1  # source: one GPU modelled
gpu.fp16_tensor = 53.8 TFLOP/s  # source: NVIDIA Turing GPU architecture whitepaper, RTX 2080 Ti (reference), FP16 Tensor with FP32 accumulate (107.6 with FP16 accumulate)
gpu.int8_tensor = 215.2 TOP/s  # source: NVIDIA Turing GPU architecture whitepaper, RTX 2080 Ti (reference), INT8 Tensor
gpu.fp32 = 13.4 TFLOP/s  # source: NVIDIA Turing GPU architecture whitepaper, RTX 2080 Ti (reference), FP32
gpu.mem_bw = 616 GB/s  # source: NVIDIA Turing GPU architecture whitepaper, RTX 2080 Ti, 11GB GDDR6 at 14 Gbps on 352 bits
gpu.mem = 11 GiB  # source: NVIDIA RTX 2080 Ti specifications "11GB GDDR6" (binary)
gpu.launch = 5 us  # source: estimate, typical CUDA kernel launch cost; the calibration's gpu_op_cycles replaces it where the profile gives the clock
gpu.clock = 1545 MHz  # source: NVIDIA RTX 2080 Ti specifications, reference boost clock
gpu.tdp = 250 W  # source: NVIDIA Turing GPU architecture whitepaper, RTX 2080 Ti (reference) board power

link.name = PCIe 3.0 x16
link.h2d_bw = 15.75 GB/s  # source: PCIe 3.0 spec, 8 GT/s x 16 lanes, 128b/130b encoding, per direction (theoretical)
link.d2h_bw = 15.75 GB/s  # source: PCIe 3.0 spec, 8 GT/s x 16 lanes, 128b/130b encoding, as h2d, per direction (theoretical)
link.latency = 10 us  # source: estimate, a small cudaMemcpy over PCIe end to end

cpu.name = Intel Core i9-13900K (8 P-cores + 16 E-cores), dual-channel DDR5
cpu.sockets = 1  # source: estimate, a desktop with one Core i9-13900K
cpu.cores = 24  # source: Intel ARK, Core i9-13900K: 8 performance + 16 efficient cores
cpu.fp32 = 2.5 TFLOP/s  # source: estimate, 8 P-cores x 5.5 GHz x 32 FLOP/cycle + 16 E-cores x 4.3 GHz x 16 FLOP/cycle (AVX2 FMA)
cpu.mem_bw = 89.6 GB/s  # source: Intel ARK, Core i9-13900K: 2 channels DDR5-5600: 2 x 5600 MT/s x 8 B (theoretical)
cpu.mem = 64 GiB  # source: estimate, a typical desktop configuration (two 32 GB DDR5 DIMMs)
