# A100 80GB SXM4 with the host of a DGX A100 (two EPYC 7742); one GPU of the eight, its link the host's PCIe Gen4 switch.
name = a100-80gb-sxm
kind = server

gpu.name = NVIDIA A100 80GB SXM4
gpu.count = 1  # source: one GPU modelled
gpu.fp16_tensor = 312 TFLOP/s  # source: NVIDIA A100 datasheet, FP16 Tensor Core, dense (624 with sparsity)
gpu.bf16_tensor = 312 TFLOP/s  # source: NVIDIA A100 datasheet, BF16 Tensor Core, dense
gpu.int8_tensor = 624 TOP/s  # source: NVIDIA A100 datasheet, INT8 Tensor Core, dense (1248 with sparsity)
gpu.fp32 = 19.5 TFLOP/s  # source: NVIDIA A100 datasheet, FP32 (non-tensor)
gpu.mem_bw = 2039 GB/s  # source: NVIDIA A100 datasheet, 80GB SXM, HBM2e bandwidth
gpu.mem = 80 GiB  # source: NVIDIA A100 datasheet "80GB" HBM (binary)
gpu.launch = 5 us  # source: estimate, typical CUDA kernel launch cost; the calibration's gpu_op_cycles replaces it where the profile gives the clock
gpu.clock = 1410 MHz  # source: NVIDIA A100 Tensor Core GPU architecture whitepaper, boost clock 1410 MHz
gpu.tdp = 400 W  # source: NVIDIA A100 datasheet, max thermal design power, 80GB SXM

link.name = PCIe 4.0 x16
link.h2d_bw = 31.5 GB/s  # source: PCIe 4.0 spec, 16 GT/s x 16 lanes, 128b/130b encoding, per direction (theoretical; about 25 GB/s is achieved)
link.d2h_bw = 31.5 GB/s  # source: PCIe 4.0 spec, 16 GT/s x 16 lanes, 128b/130b encoding, as h2d, per direction (theoretical; about 25 GB/s is achieved)
link.latency = 10 us  # source: estimate, a small cudaMemcpy over PCIe end to end

cpu.name = 2x AMD EPYC 7742 (the DGX A100 host)
cpu.sockets = 2  # source: NVIDIA DGX A100 datasheet, dual AMD Rome 7742
cpu.cores = 128  # source: NVIDIA DGX A100 datasheet, 128 cores total
cpu.fp32 = 4.6 TFLOP/s  # source: estimate, 128 cores x 2.25 GHz base x 16 FLOP/cycle (two 256-bit FMA units, Zen 2)
cpu.mem_bw = 409.6 GB/s  # source: AMD EPYC 7742 specifications, 8 channels DDR4-3200 per socket: 2 x 8 x 3200 MT/s x 8 B (theoretical)
cpu.mem = 1 TiB  # source: NVIDIA DGX A100 datasheet, 1TB system memory
