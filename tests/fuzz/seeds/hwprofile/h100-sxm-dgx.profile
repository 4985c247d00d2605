# H100 SXM with the host of a DGX H100 (two Sapphire Rapids sockets). One
# GPU of the eight is modelled; its link is the host's PCIe Gen5 switch.
name = h100-sxm-dgx
kind = server

gpu.name = NVIDIA H100 SXM5 80GB
gpu.count = 1                  # source: one GPU of the DGX's eight modelled
gpu.fp16_tensor = 989.4 TFLOP/s # source: NVIDIA H100 datasheet, SXM, FP16 Tensor Core, dense (1979 with sparsity)
gpu.bf16_tensor = 989.4 TFLOP/s # source: NVIDIA H100 datasheet, SXM, BF16 Tensor Core, dense
gpu.int8_tensor = 1979 TOP/s   # source: NVIDIA H100 datasheet, SXM, INT8 Tensor Core, dense (3958 with sparsity)
gpu.fp32 = 67 TFLOP/s          # source: NVIDIA H100 datasheet, SXM, FP32 (non-tensor)
gpu.mem_bw = 3.35 TB/s         # source: NVIDIA H100 datasheet, SXM, HBM3 bandwidth
gpu.mem = 80 GiB               # source: NVIDIA H100 datasheet "80GB" (binary, as HBM stacks are)
gpu.launch = 5 us              # source: estimate, typical CUDA kernel launch cost; calibration replaces it

link.name = PCIe 5.0 x16
link.h2d_bw = 63 GB/s          # source: PCIe 5.0 spec, 32 GT/s x 16 lanes, 128b/130b encoding, per direction (theoretical)
link.d2h_bw = 63 GB/s          # source: PCIe 5.0 spec, as h2d (theoretical, per direction)
link.latency = 10 us           # source: estimate, a small cudaMemcpy over PCIe end to end; calibration replaces it

cpu.name = 2x Intel Xeon Platinum 8480C (Sapphire Rapids)
cpu.sockets = 2                # source: NVIDIA DGX H100 datasheet, dual Xeon Platinum 8480C
cpu.cores = 112                # source: NVIDIA DGX H100 datasheet, 112 cores total
cpu.fp32 = 14.3 TFLOP/s        # source: estimate, 112 cores x 2.0 GHz base x 64 FLOP/cycle (two AVX-512 FMA units)
cpu.int8 = 57.3 TOP/s          # source: estimate, 112 cores x 2.0 GHz x 256 OP/cycle (AVX-512 VNNI; AMX not counted)
cpu.mem_bw = 614.4 GB/s        # source: Intel ARK, 8 channels DDR5-4800 per socket: 2 x 8 x 4800 MT/s x 8 B (theoretical)
cpu.mem = 2 TiB                # source: NVIDIA DGX H100 datasheet, 2TB system memory
