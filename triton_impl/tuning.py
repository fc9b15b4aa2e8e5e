"""The tuned data of the Triton kernels, written once: the forward's tables and constants,
the fused residual add's, and the backward's. Nothing here decides; the rules that read
this data are triton_impl.configs (default_config, fused_add_config and their latency
rules) and triton_impl.backward (bwd_config, bwd_stages, programs_per_sm).

Every table is keyed by one type, ``Width(element_size, block_n, padded, dtype)``
(triton_impl.config_types): dtype is set only on an entry the sweep measured for one dtype.

Tuning flows one way: the sweep's records (results/h200/sweeps/*.jsonl) and the probes (probes/) ->
this file -> tests (every candidate computes the same function; the rules pick what they
say) -> the benchmark. Why each entry is what it is, with the measurements: the notebook
entry each comment names (docs/notebook/NN-*.md, vNN; docs/notebook/README.md, the index).
"""

from __future__ import annotations

import dataclasses

from triton_impl.config_types import Config, Width
from triton_impl.config_types import fused_config as _fused

# ---- the forward ------------------------------------------------------------------------
#: Widest power-of-two row the fused kernel keeps in registers, per element size in bytes.
FUSED_MAX_N = {4: 32768, 2: 16384}

#: The fused kernel's tile and warps per width where the sweep measured one other than
#: formula_tile's (docs/notebook/01-why-the-defaults.md); the other widths take the formula's.
#: The looped kernel's rows of at most LATENCY_FIRST_MAX_BYTES start their decode-sized
#: calls from the formula's tile (latency_config keeps only its width).
FUSED_TUNED = {
    Width(2, 128): _fused(128, 16, 8),
    Width(2, 512): _fused(512, 4, 4),
    Width(2, 2048): _fused(2048, 1, 4),
    Width(4, 32768): _fused(32768, 1, 16),
    Width(4, 1024, padded=True): _fused(1024, 1, 1),
}
#: The sharded kernel's shipped configs per element size: each program waits for its row's
#: sum, then reads its shard again rather than holding it through the wait
#: (docs/notebook/06-wide-rows.md, v24, v26).
SHARDED = {
    2: Config("sharded", 16384, 8, stream_y=True, wait=True, reload=True),
    4: Config("sharded", 8192, 16, stream_y=True, wait=True, reload=True),
}
#: rms_norm's rows of LOOPED_ROW_BYTES (both bounds included: 16-bit 4096-32768, fp32
#: 2048-16384) take the looped kernel, ahead of every fused tile, the persistent and the
#: chunked kernel there (docs/notebook/16-why-inductor-wins.md, v56): chunks of at most
#: LOOPED_CHUNK_BYTES of a row; LOOPED_THREAD_BYTES of the program's rows a thread, up to
#: 32 warps (fewer bytes a thread left the SM's loads too few: 8192 on 32 warps, one row);
#: two rows a program for rows of a power of two of at most LOOPED_TWO_ROWS_MAX_BYTES.
LOOPED_ROW_BYTES = (8192, 65536)
LOOPED_CHUNK_BYTES = 16384
LOOPED_THREAD_BYTES = 32
LOOPED_TWO_ROWS_MAX_BYTES = 16384
#: The looped kernel's configs where the sweep measured one ahead of looped_config's:
#: fp32 rows of 5120-8191 elements two to a program on 32 warps; 16-bit rows of 8193-16383
#: in chunks of 4096 on 16 warps, where the rule's 32 warps left 10240 a few points short
#: and 12288 within the spread (docs/notebook/16-why-inductor-wins.md, v58).
LOOPED_TUNED = {
    Width(4, 8192, padded=True): Config("looped", 4096, 32, block_m=2),
    Width(2, 16384, padded=True): Config("looped", 4096, 16),
}
#: Bytes of the tile a thread holds, for widths not in FUSED_TUNED and for the split kernel.
THREAD_BYTES = {2: 64, 4: 32}
#: Bytes of a row a thread holds for decode-sized calls (latency_config), and the most warps
#: a row takes there; rows of the fused kernel up to LATENCY_FIRST_MAX_BYTES (the widths
#: the decode probe measured: bf16 4096 and 8192) load the weight first, on at most
#: LATENCY_FIRST_MAX_WARPS warps.
LATENCY_THREAD_BYTES = 32
LATENCY_MAX_WARPS = 16
LATENCY_FIRST_MAX_BYTES = 16384
LATENCY_FIRST_MAX_WARPS = 8

# ---- the fused residual add -------------------------------------------------------------
#: The fused add's rows wider than FUSED_MAX_N: the sharded kernel, its programs waiting for
#: their row's sum (docs/notebook/06-wide-rows.md, v24).
FUSED_ADD_WIDE = {
    2: Config("sharded", 8192, 4, stream_y=True, wait=True),
    4: Config("sharded", 4096, 4, stream_y=True, wait=True),
}
#: Widths where wide rows take another config than FUSED_ADD_WIDE's, keyed by the
#: power-of-two width (and, for an entry of one dtype, that dtype: Width.dtype, for x and
#: residual of that dtype): 16-bit rows to 32768 take the fused tile, the row held on 32
#: warps (docs/notebook/16-why-inductor-wins.md, v58); fp16 reads its shard again
#: after the wait at 65536 and 131072, where the held shard's registers leave it fewer
#: programs an SM than bf16 (docs/notebook/06-wide-rows.md, v29).
FUSED_ADD_WIDE_TUNED = {
    Width(2, 32768): _fused(32768, 1, 32),
    Width(2, 65536, dtype="fp16"): dataclasses.replace(FUSED_ADD_WIDE[2], reload=True),
    Width(2, 131072, dtype="fp16"): dataclasses.replace(FUSED_ADD_WIDE[2], reload=True),
}
#: The fused add's fused tiles where its sweep measured one ahead of the formula's
#: (docs/notebook/07-decode-and-host-time.md, v36): fp32 12288 on 8 warps, more bytes a
#: thread in flight than 32 warps hold.
FUSED_ADD_TUNED = {Width(4, 16384, padded=True): _fused(16384, 1, 8)}
#: Bytes of x's row a thread holds in the fused add's split kernel: the sweep's best at
#: 4095 / 4097 in every dtype (docs/notebook/07-decode-and-host-time.md, v36); twice the
#: warps left loads waiting.
FUSED_ADD_SPLIT_THREAD_BYTES = 64
#: The fused add's decode-sized calls (fewer programs than SMs): one row a program on these
#: warps for the widths the decode probe measured (bf16 4096 and 8192;
#: docs/notebook/07-decode-and-host-time.md, v36), else FUSED_ADD_LATENCY_THREAD_BYTES of
#: x's row a thread (x's and the residual's both in flight: half rms_norm's
#: LATENCY_THREAD_BYTES), up to 32 warps.
FUSED_ADD_LATENCY_WARPS = {Width(2, 4096): 8, Width(2, 8192): 32}
FUSED_ADD_LATENCY_THREAD_BYTES = 16

# ---- the backward (both ops) ------------------------------------------------------------
#: Widest power-of-two row a program keeps in registers; wider rows go in BWD_CHUNK chunks.
BWD_MAX_N = 16384
BWD_CHUNK = 4096
#: Rows whose power of two holds this many bytes (fp32 16384, 16-bit 32768) are sharded: a
#: row split over programs of at most BWD_SHARD_N columns that exchange its sums through
#: global memory, BWD_SHARD_THREAD_ELEMS elements a thread, BWD_SHARD_WARPS_PER_SM warps of
#: them an SM (registers capped so that they are all resident;
#: docs/notebook/12-the-pass-launch-and-the-sharded-backward.md, v41).
BWD_SHARD_FROM_BYTES = 65536
BWD_SHARD_N = 2048
BWD_SHARD_THREAD_ELEMS = 16
BWD_SHARD_WARPS_PER_SM = 16
#: fp32 elements of s and dy (each) a thread holds for the register-resident rows.
BWD_THREAD_ELEMS = 8
#: Register-resident tiles wider than their threads' BWD_THREAD_ELEMS (16-bit 16384 on 16
#: warps) load the weight each row, for the sum and again for ds, rather than hold it across
#: the row's reduction (1), which spilled (0): faster there in both ops; the split rows'
#: tiles and every narrower tile lost so, and hold it
#: (docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v51).
BWD_WEIGHT_EACH_ROW = 1
#: The most warps a register-resident row takes (its tile / BWD_THREAD_ELEMS threads up to
#: this): 32 to tiles of BWD_MAX_WARPS_N, 16 wider. 8192 measured faster on 32 than on 16
#: (both dtypes, both ops); 16-bit 16384, which spills on either, slower, the fused add most
#: (docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v50).
BWD_MAX_WARPS = 32
BWD_MAX_WARPS_N = 8192
BWD_WIDE_MAX_WARPS = 16
#: Warps of a program the register-resident rows aim at an SM, and the programs that makes
#: (more or fewer programs an SM did not move the chunked rows:
#: docs/notebook/05-the-backward.md, v16).
BWD_WARPS_PER_SM = 32
#: Software-pipeline stages of the register-resident row loop (Triton's tl.range): 1 issues
#: each row's loads when its turn comes, 3 keeps the next two rows' loads in flight (through
#: shared memory) while one is reduced (backward.bwd_stages says where;
#: docs/notebook/05-the-backward.md, v16).
#: The widest tile of 16-bit rows that takes BWD_PIPELINED stages.
BWD_PIPELINED_MAX_N = 8192
BWD_PIPELINED = 3
#: The final reduction's tile: partials elements a program loads at once (many loads in
#: flight, not one dependent load a partial row: docs/notebook/05-the-backward.md, v14),
#: over its dweight columns: the widest of DW_MIN_BLOCK_N (32 bytes of fp32), 2x, ...
#: DW_BLOCK_N of whose programs (the last one partial) there are at least as many as SMs
#: (narrow rows have the most partials rows, which 64 columns always left to a few
#: programs, slower; docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v47).
DW_TILE = 4096
DW_BLOCK_N = 64
DW_MIN_BLOCK_N = 8
