# A10 24GB in a cloud VM of the same class as the L4's.
name = a10-cloud-vm
kind = cloud-vm

gpu.name = NVIDIA A10 24GB
gpu.count = 1  # source: one GPU modelled
gpu.fp16_tensor = 125 TFLOP/s  # source: NVIDIA A10 datasheet, FP16 Tensor Core, dense (250 with sparsity)
gpu.bf16_tensor = 125 TFLOP/s  # source: NVIDIA A10 datasheet, BF16 Tensor Core, dense
gpu.int8_tensor = 250 TOP/s  # source: NVIDIA A10 datasheet, INT8 Tensor Core, dense (500 with sparsity)
gpu.fp32 = 31.2 TFLOP/s  # source: NVIDIA A10 datasheet, FP32
gpu.mem_bw = 600 GB/s  # source: NVIDIA A10 datasheet, GDDR6 bandwidth
gpu.mem = 24 GiB  # source: NVIDIA A10 datasheet "24GB" (binary)
gpu.launch = 5 us  # source: estimate, typical CUDA kernel launch cost; the calibration's gpu_op_cycles replaces it where the profile gives the clock
gpu.clock = 1695 MHz  # source: NVIDIA A10 product brief, boost clock
gpu.tdp = 150 W  # source: NVIDIA A10 datasheet, max thermal design power

link.name = PCIe 4.0 x16
link.h2d_bw = 31.5 GB/s  # source: PCIe 4.0 spec, 16 GT/s x 16 lanes, 128b/130b encoding, per direction (theoretical; about 25 GB/s is achieved)
link.d2h_bw = 31.5 GB/s  # source: PCIe 4.0 spec, 16 GT/s x 16 lanes, 128b/130b encoding, as h2d, per direction (theoretical; about 25 GB/s is achieved)
link.latency = 10 us  # source: estimate, a small cudaMemcpy over PCIe end to end

cpu.name = cloud VM, 16 vCPUs of a Xeon (Cascade Lake) host, e.g. GCP g2-standard-16
cpu.sockets = 1  # source: estimate, a VM's share of one host socket
cpu.cores = 8  # source: estimate, 16 vCPUs, two hyperthreads per physical core
cpu.fp32 = 1.28 TFLOP/s  # source: estimate, 8 cores x 2.5 GHz x 64 FLOP/cycle (two AVX-512 FMA units)
cpu.mem_bw = 35 GB/s  # source: estimate, a 16-vCPU share of one Cascade Lake socket's 6 x DDR4-2933 channels (141 GB/s); the VM's share is unknown
cpu.mem = 64 GiB  # source: GCP g2-standard-16 machine type: 64 GB (the L4 shape; an A10 VM class is alike)
