"""tilelab.nki.flash_paged_attention: NaN in a query or in a key a row attends to makes that row
NaN (never a finite answer); masked keys never contribute."""

import numpy as np
import pytest
from nki_reference import continuous_batch

import tilelab.nki as nki


@pytest.mark.parametrize("schedule", ["cpu", "tile"])
@pytest.mark.parametrize("mixed_precision", [True, False])
@pytest.mark.parametrize("where", ["query", "context key", "new key"])
def test_paged_attention_nan_is_not_hidden(rng, schedule, mixed_precision, where):
    args = continuous_batch(
        rng,
        [(40, 300), (1, 33)],
        n_heads=4,
        n_kv_heads=2,
        head_dim=32,
        block_size=32,
        large_tile=512,
        dtype=np.float32,
    )
    mask = args["mask"]
    row = 10  # a row of the first request: sees its 300 context tokens and new tokens 0..10
    if where == "query":
        args["query"][0, 1, 5, row] = np.nan
    elif where == "context key":
        block = args["block_tables"][2]  # context tokens 64..95 of the first request
        args["kv_cache"][0, block, 0, 7, 3] = np.nan
    else:
        args["key"][0, 0, 3, 4] = np.nan  # new token 4, visible to rows 4..39
    assert mask[row].any()
    out = nki.flash_paged_attention(
        args["query"],
        args["key"],
        args["value"],
        args["kv_cache"],
        args["block_tables"],
        nki.reorder_context_mask(mask, 512, 32),
        mixed_precision=mixed_precision,
        LARGE_TILE_SZ=512,
        schedule=schedule,
    )
    head = 1 if where == "query" else 0
    assert np.isnan(out[0, head, row]).all()
    # The second request (row 40) sees none of it.
    assert np.isfinite(out[0, :, 40]).all()
