# T4 cloud VM: the FlexGen paper's setting (a GCP VM with one T4 and 208 GB
# of host memory, the n1-highmem-32 shape).
name = t4-cloud-vm
kind = cloud-vm

gpu.name = NVIDIA T4 16GB
gpu.count = 1                  # source: FlexGen paper (ICML 2023), one T4 16GB
gpu.fp16_tensor = 65 TFLOP/s   # source: NVIDIA T4 datasheet, mixed precision FP16/FP32 Tensor
gpu.int8_tensor = 130 TOP/s    # source: NVIDIA T4 datasheet, INT8
gpu.fp32 = 8.1 TFLOP/s         # source: NVIDIA T4 datasheet, single precision
gpu.mem_bw = 320 GB/s          # source: NVIDIA T4 datasheet, GDDR6 bandwidth
gpu.mem = 16 GiB               # source: NVIDIA T4 datasheet "16 GB GDDR6" (binary)
gpu.launch = 5 us              # source: estimate, typical CUDA kernel launch cost; calibration replaces it

link.name = PCIe 3.0 x16
link.h2d_bw = 15.75 GB/s       # source: PCIe 3.0 spec, 8 GT/s x 16 lanes, 128b/130b encoding, per direction (theoretical)
link.d2h_bw = 15.75 GB/s       # source: PCIe 3.0 spec, as h2d (theoretical, per direction)
link.latency = 10 us           # source: estimate, a small cudaMemcpy over PCIe end to end; calibration replaces it

cpu.name = Intel Xeon @ 2.00GHz (GCP n1-highmem-32, 32 vCPUs)
cpu.sockets = 1                # source: estimate, a VM's share of one host socket
cpu.cores = 16                 # source: GCP n1-highmem-32: 32 vCPUs, two hyperthreads per physical core
cpu.fp32 = 2.05 TFLOP/s        # source: estimate, 16 cores x 2.0 GHz x 64 FLOP/cycle (two AVX-512 FMA units, Skylake server)
cpu.mem_bw = 64 GB/s           # source: estimate, half of one Skylake socket's 6 x DDR4-2666 channels (128 GB/s); the VM's share is unknown
cpu.mem = 208 GB               # source: FlexGen paper, 208 GB CPU DRAM (GCP n1-highmem-32)
