"""2-D average pooling (the NKI tutorial "Average Pool 2D"), in the NKI language.

in_tensor is (C, H, W) with C <= 128 on partitions; the result is (C, H // pool, W // pool),
each output the mean of a pool x pool window (rows and columns beyond a whole window are not
read). The window is addressed with nl.mgrid expressions that split a row index into
(window row, row within the window), `pool * i_row + i_dy`, so the tile is read as a 5-D
pattern [C, H_out, pool, W_out, pool] and summed over the two within-window axes.
"""

import neuronxcc.nki.language as nl
from neuronxcc import nki
from neuronxcc.nki.typing import tensor


@nki.jit
def avgpool2d(in_tensor, pool):
    channels, height, width = in_tensor.shape
    out_h, out_w = height // pool, width // pool
    out = nl.ndarray((channels, out_h, out_w), dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    i_c, i_row, i_dy, i_col, i_dx = nl.mgrid[0:channels, 0:out_h, 0:pool, 0:out_w, 0:pool]
    image: tensor[channels, height, width] = nl.load(in_tensor)
    window_sum = nl.sum(image[i_c, pool * i_row + i_dy, pool * i_col + i_dx], axis=[2, 4])
    nl.store(out, value=window_sum / (pool * pool))
    return out
