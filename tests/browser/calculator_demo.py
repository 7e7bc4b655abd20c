# %% [markdown]
# # Calculator browser check
# Opened by `tests/test_browser.py`: the "will it fit" calculator of notebook 03; the test
# moves the batch slider with the keyboard, then picks a LoRA rank, and checks that the bar and
# the verdict redraw after each.

# %%
from IPython.display import display

from tutorial_utils.calculator import Calculator

calc = Calculator(preset="gpt2-124m", batch=1, seq=512, sharding="none", n_gpus=1)
display(calc)
