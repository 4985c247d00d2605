# A100 80GB PCIe in a two-socket Xeon server: the class of machine the
# Q-Infer paper evaluates on. The host is a representative Ice Lake part,
# not the paper's exact machine; its figures are marked as estimates.
name = a100-pcie-2xeon
kind = server

gpu.name = NVIDIA A100 80GB PCIe
gpu.count = 1                  # source: one GPU modelled (the paper's single-GPU setting)
gpu.fp16_tensor = 312 TFLOP/s  # source: NVIDIA A100 datasheet, FP16 Tensor Core, dense (624 with sparsity)
gpu.bf16_tensor = 312 TFLOP/s  # source: NVIDIA A100 datasheet, BF16 Tensor Core, dense
gpu.int8_tensor = 624 TOP/s    # source: NVIDIA A100 datasheet, INT8 Tensor Core, dense (1248 with sparsity)
gpu.fp32 = 19.5 TFLOP/s        # source: NVIDIA A100 datasheet, FP32 (non-tensor)
gpu.mem_bw = 1935 GB/s         # source: NVIDIA A100 datasheet, 80GB PCIe, HBM2e bandwidth
gpu.mem = 80 GiB               # source: NVIDIA A100 datasheet "80GB HBM2e" (binary: 81920 MiB as the driver reports)
gpu.launch = 5 us              # source: estimate, typical CUDA kernel launch cost; calibration replaces it
gpu.clock = 1410 MHz           # source: NVIDIA A100 Tensor Core GPU architecture whitepaper, boost clock 1410 MHz
gpu.tdp = 300 W               # source: NVIDIA A100 datasheet, max thermal design power, 80GB PCIe

link.name = PCIe 4.0 x16
link.h2d_bw = 31.5 GB/s        # source: PCIe 4.0 spec, 16 GT/s x 16 lanes, 128b/130b encoding, per direction (theoretical; about 25 GB/s is achieved)
link.d2h_bw = 31.5 GB/s        # source: PCIe 4.0 spec, as h2d (theoretical, per direction)
link.latency = 10 us           # source: estimate, a small cudaMemcpy over PCIe end to end; calibration replaces it

cpu.name = 2x Intel Xeon Gold 6330 (Ice Lake, representative)
cpu.sockets = 2                # source: two-socket server as in the Q-Infer paper's setup
cpu.cores = 56                 # source: Intel ARK, Xeon Gold 6330: 28 cores per socket
cpu.fp32 = 7.17 TFLOP/s        # source: estimate, 56 cores x 2.0 GHz base x 64 FLOP/cycle (two AVX-512 FMA units)
cpu.int8 = 28.7 TOP/s          # source: estimate, 56 cores x 2.0 GHz x 256 OP/cycle (AVX-512 VNNI, two ports)
cpu.mem_bw = 375.4 GB/s        # source: Intel ARK, 8 channels DDR4-2933 per socket: 2 x 8 x 2933 MT/s x 8 B (theoretical)
cpu.mem = 512 GiB              # source: estimate, a typical configuration for this class of server
