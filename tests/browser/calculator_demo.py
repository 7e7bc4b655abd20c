# %% [markdown]
# # Calculator browser check
# Opened by `tests/test_browser.py`: the "will it fit" calculator of notebook 03; the test
# moves the batch slider with the keyboard, picks a LoRA rank, then ticks logits_kept, and checks
# that the bar and the verdict redraw after each and that the chart's title agrees with the verdict.

# %%
from IPython.display import display

from tutorial_utils.calculator import Calculator

calc = Calculator(preset="gpt2-124m", batch=1, seq=512, sharding="none", n_gpus=1)
display(calc)
