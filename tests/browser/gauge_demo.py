# %% [markdown]
# # LiveGauge browser check
# Opened by `tests/test_browser.py`: a gauge samples every 100 ms while the next cell allocates
# and frees memory; the test reads the bars twice and checks that they moved.

# %%
import time

import torch

from tutorial_utils.gauges import LiveGauge

gauge = LiveGauge(sources=["torch", "psutil"], period_s=0.1)
gauge.start()

# %%
# About 30 s of work: grow to 12 blocks of 8 MiB (written, so RSS grows too), free, repeat.
blocks = []
for _ in range(300):
    blocks.append(torch.ones(2 * 2**20))  # 2 Mi float32 = 8 MiB
    if len(blocks) == 12:
        blocks = []
    time.sleep(0.1)

# %%
gauge.stop()
