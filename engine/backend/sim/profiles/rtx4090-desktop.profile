# RTX 4090 desktop: the high-end PC the PowerInfer paper evaluates on (a
# Core i9-13900K with 192 GB of DDR5).
name = rtx4090-desktop
kind = desktop

gpu.name = NVIDIA GeForce RTX 4090
gpu.count = 1                  # source: PowerInfer paper (SOSP 2024), PC-High: one RTX 4090
gpu.fp16_tensor = 165.2 TFLOP/s # source: NVIDIA Ada Lovelace architecture whitepaper, RTX 4090, FP16 Tensor with FP32 accumulate, dense (330.3 with FP16 accumulate)
gpu.bf16_tensor = 165.2 TFLOP/s # source: NVIDIA Ada Lovelace architecture whitepaper, RTX 4090, BF16 Tensor with FP32 accumulate, dense
gpu.int8_tensor = 660.6 TOP/s  # source: NVIDIA Ada Lovelace architecture whitepaper, RTX 4090, INT8 Tensor, dense (1321.2 with sparsity)
gpu.fp32 = 82.6 TFLOP/s        # source: NVIDIA Ada Lovelace architecture whitepaper, RTX 4090, FP32 (non-tensor)
gpu.mem_bw = 1008 GB/s         # source: NVIDIA RTX 4090 specifications, 24GB GDDR6X at 21 Gbps on 384 bits
gpu.mem = 24 GiB               # source: NVIDIA RTX 4090 specifications "24GB GDDR6X" (binary)
gpu.launch = 5 us              # source: estimate, typical CUDA kernel launch cost; calibration replaces it
gpu.clock = 2520 MHz           # source: NVIDIA Ada Lovelace architecture whitepaper, RTX 4090 boost clock
gpu.tdp = 450 W               # source: NVIDIA Ada Lovelace architecture whitepaper, RTX 4090 total graphics power

link.name = PCIe 4.0 x16
link.h2d_bw = 31.5 GB/s        # source: PCIe 4.0 spec, 16 GT/s x 16 lanes, 128b/130b encoding, per direction (theoretical; about 25 GB/s is achieved)
link.d2h_bw = 31.5 GB/s        # source: PCIe 4.0 spec, as h2d (theoretical, per direction)
link.latency = 10 us           # source: estimate, a small cudaMemcpy over PCIe end to end; calibration replaces it

cpu.name = Intel Core i9-13900K (8 P-cores + 16 E-cores)
cpu.sockets = 1                # source: PowerInfer paper, PC-High: one i9-13900K
cpu.cores = 24                 # source: Intel ARK, Core i9-13900K: 8 performance + 16 efficient cores
cpu.fp32 = 2.5 TFLOP/s         # source: estimate, 8 P-cores x 5.5 GHz x 32 FLOP/cycle + 16 E-cores x 4.3 GHz x 16 FLOP/cycle (AVX2 FMA)
cpu.mem_bw = 89.6 GB/s         # source: Intel ARK, 2 channels DDR5-5600: 2 x 5600 MT/s x 8 B (theoretical; four DIMMs run slower)
cpu.mem = 192 GiB              # source: PowerInfer paper, PC-High: 192 GB host memory
