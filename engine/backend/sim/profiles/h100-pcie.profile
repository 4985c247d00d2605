# H100 PCIe 80GB in a two-socket Sapphire Rapids server.
name = h100-pcie
kind = server

gpu.name = NVIDIA H100 PCIe 80GB
gpu.count = 1  # source: one GPU modelled
gpu.fp16_tensor = 756 TFLOP/s  # source: NVIDIA H100 datasheet, PCIe, FP16 Tensor Core, dense (1513 with sparsity)
gpu.bf16_tensor = 756 TFLOP/s  # source: NVIDIA H100 datasheet, PCIe, BF16 Tensor Core, dense
gpu.int8_tensor = 1513 TOP/s  # source: NVIDIA H100 datasheet, PCIe, INT8 Tensor Core, dense (3026 with sparsity)
gpu.fp32 = 51 TFLOP/s  # source: NVIDIA H100 datasheet, PCIe, FP32
gpu.mem_bw = 2 TB/s  # source: NVIDIA H100 datasheet, PCIe, HBM2e bandwidth
gpu.mem = 80 GiB  # source: NVIDIA H100 datasheet "80GB" (binary)
gpu.launch = 5 us  # source: estimate, typical CUDA kernel launch cost; the calibration's gpu_op_cycles replaces it where the profile gives the clock
gpu.clock = 1755 MHz  # source: NVIDIA H100 Tensor Core GPU architecture whitepaper, H100 PCIe boost clock
gpu.tdp = 350 W  # source: NVIDIA H100 datasheet, PCIe, max thermal design power 300-350W (the upper)

link.name = PCIe 5.0 x16
link.h2d_bw = 63 GB/s  # source: PCIe 5.0 spec, 32 GT/s x 16 lanes, 128b/130b encoding, per direction (theoretical)
link.d2h_bw = 63 GB/s  # source: PCIe 5.0 spec, 32 GT/s x 16 lanes, 128b/130b encoding, as h2d, per direction (theoretical)
link.latency = 10 us  # source: estimate, a small cudaMemcpy over PCIe end to end

cpu.name = 2x Intel Xeon Platinum 8480+ (Sapphire Rapids)
cpu.sockets = 2  # source: estimate, a two-socket PCIe Gen5 server
cpu.cores = 112  # source: Intel ARK, Xeon Platinum 8480+: 56 cores per socket
cpu.fp32 = 14.3 TFLOP/s  # source: estimate, 112 cores x 2.0 GHz base x 64 FLOP/cycle (two AVX-512 FMA units)
cpu.int8 = 57.3 TOP/s  # source: estimate, 112 cores x 2.0 GHz x 256 OP/cycle (AVX-512 VNNI; AMX not counted)
cpu.mem_bw = 614.4 GB/s  # source: Intel ARK, 8 channels DDR5-4800 per socket: 2 x 8 x 4800 MT/s x 8 B (theoretical)
cpu.mem = 1 TiB  # source: estimate, a typical configuration for this class of server
