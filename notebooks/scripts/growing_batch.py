"""A batch that grows every step on the GPU; prints the peak reserved and allocated bytes."""

import json

import torch

if not torch.cuda.is_available():
    raise SystemExit("growing_batch.py needs a CUDA GPU: segments exist only in its allocator")
unit = 2**18  # 256 KiB
for n in range(64, 96):  # a batch that grows by one every step
    acts = [torch.empty(n * k * unit, dtype=torch.uint8, device="cuda") for k in (1, 2, 4)]
    del acts  # the step ends: everything is freed
peaks = {
    "reserved": torch.cuda.max_memory_reserved(),
    "allocated": torch.cuda.max_memory_allocated(),
}
print(json.dumps(peaks))
