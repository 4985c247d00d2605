# L40S 48GB in a two-socket Sapphire Rapids server.
name = l40s
kind = server

gpu.name = NVIDIA L40S 48GB
gpu.count = 1  # source: one GPU modelled
gpu.fp16_tensor = 362 TFLOP/s  # source: NVIDIA L40S datasheet, FP16 Tensor Core, dense (733 with sparsity)
gpu.bf16_tensor = 362 TFLOP/s  # source: NVIDIA L40S datasheet, BF16 Tensor Core, dense
gpu.int8_tensor = 733 TOP/s  # source: NVIDIA L40S datasheet, INT8 Tensor Core, dense (1466 with sparsity)
gpu.fp32 = 91.6 TFLOP/s  # source: NVIDIA L40S datasheet, FP32
gpu.mem_bw = 864 GB/s  # source: NVIDIA L40S datasheet, GDDR6 bandwidth
gpu.mem = 48 GiB  # source: NVIDIA L40S datasheet "48GB" (binary)
gpu.launch = 5 us  # source: estimate, typical CUDA kernel launch cost; the calibration's gpu_op_cycles replaces it where the profile gives the clock
gpu.clock = 2520 MHz  # source: NVIDIA L40S datasheet, boost clock
gpu.tdp = 350 W  # source: NVIDIA L40S datasheet, max power consumption

link.name = PCIe 4.0 x16
link.h2d_bw = 31.5 GB/s  # source: PCIe 4.0 spec, 16 GT/s x 16 lanes, 128b/130b encoding, per direction (theoretical; about 25 GB/s is achieved)
link.d2h_bw = 31.5 GB/s  # source: PCIe 4.0 spec, 16 GT/s x 16 lanes, 128b/130b encoding, as h2d, per direction (theoretical; about 25 GB/s is achieved)
link.latency = 10 us  # source: estimate, a small cudaMemcpy over PCIe end to end

cpu.name = 2x Intel Xeon Platinum 8480+ (Sapphire Rapids)
cpu.sockets = 2  # source: estimate, a two-socket PCIe Gen5 server
cpu.cores = 112  # source: Intel ARK, Xeon Platinum 8480+: 56 cores per socket
cpu.fp32 = 14.3 TFLOP/s  # source: estimate, 112 cores x 2.0 GHz base x 64 FLOP/cycle (two AVX-512 FMA units)
cpu.int8 = 57.3 TOP/s  # source: estimate, 112 cores x 2.0 GHz x 256 OP/cycle (AVX-512 VNNI; AMX not counted)
cpu.mem_bw = 614.4 GB/s  # source: Intel ARK, 8 channels DDR5-4800 per socket: 2 x 8 x 4800 MT/s x 8 B (theoretical)
cpu.mem = 1 TiB  # source: estimate, a typical configuration for this class of server
