// The CUDA forward's launch configs: the variant bits, the ladders and their rules, the
// two ops' rung tables (read from tuning/*.inc, the data) and the constexpr machinery that
// derives the compiled configs from them. Included by the kernels' units (forward_*.cu,
// through forward_kernels.cuh) and by the host dispatch (forward.cu).
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>

namespace cuda_impl {
namespace {

constexpr int kMaxClusterRanks = 8;  // portable cluster size
// A staged row's clusters (kStagedRow) may take up to 16 CTAs, the H100/H200's non-portable
// size (asked for at launch): a slice of 256 x 8 vectors a CTA, the fastest, holds a 16-bit
// row of 262144 only on 16 CTAs.
constexpr int kMaxStagedRanks = 16;

// Kernel variants (bits of Config::variant):
// - kPlainLoads: x through a plain `ld.global.v4` (SASS LDG.E.128), what Triton emits for
//   the same access, instead of the read-only, non-allocating load (LDG.E.NA.128.CONSTANT):
//   ahead wherever several CTAs share an SM, behind for a 1024-thread CTA alone on its SM.
// - kLeanRegs: x's vectors are re-read as raw bits after the reduction, so the compiler
//   converts them to fp32 again for the store instead of keeping the fp32 copies alive
//   through the reduction: fewer registers, more CTAs an SM.
// Measurements behind each: docs/notebook/01-why-the-defaults.md.
constexpr int kPlainLoads = 1;
constexpr int kLeanRegs = 2;
// - kLateWeight: no early weight vectors; the weight is read after the reduction, as for
//   wider rows (its 16 registers a thread cost occupancy: beside the fused add's residual
//   vectors, and on rows off the 16-byte grid, where few rows could use them).
constexpr int kLateWeight = 16;
// - kRowChunks (rms_norm, one CTA a row): the row in CTA-wide chunks of ROW_THREADS x VPT
//   vectors, the first held in registers with its weight loaded beside it, the rest summed
//   as they arrive and read again for the scale; every access a whole 16-byte vector, no
//   scalar head or tail (row_chunks).
constexpr int kRowChunks = 32;
// - kReread (with kRowChunks): no chunk held through the sum either: every chunk summed as
//   it arrives and read again for the scale, as Triton's looped kernel and torch.compile's
//   generated one do, so a thread holds nothing of the row across the reduction; a chunk's
//   vectors all in flight before its first store, with Triton's L2 eviction priorities
//   (the first read kept for the second, the second the last).
constexpr int kReread = 4;
// - kWholeVectors | kStagedRow (clusters of both ops, the two together): a row whose every
//   access is a whole aligned 16-byte vector takes staged_slice: each CTA a contiguous
//   slice, no scalar head or tail, no per-access alignment test, copied into shared memory
//   by cp.async.ca (an L1-allocating copy: the non-allocating .cg lost at every shape,
//   docs/notebook/06-wide-rows.md, v32) and read from there twice, the weight (of
//   x's dtype) loaded into registers while the copies fly: no row values held in registers
//   through the cluster's sum. Dynamic shared memory: ROW_THREADS x VPT x 16 bytes (the
//   fused add: and the residual's). Other rows take the general body (kPlainLoads and
//   kLeanRegs apply to it).
constexpr int kWholeVectors = 64;
constexpr int kStagedRow = 128;
// - kPlusOne: a launch's flag, never a table's: the weight read as weight + 1, added in fp32
//   (Gemma's offset), an immediate in each body's weight conversion, so it takes no
//   register (a run-time offset beside every body spilled the tightest ones:
//   docs/notebook/17-the-op-as-data.md). Compiled for the configs the ladders name, with a
//   weight of x's dtype and the fused add's residual of x's dtype; any other offset, or
//   dtype, reads an fp32 weight + offset made by the launcher.
constexpr int kPlusOne = 256;
// - kHeads: a launch's flag (rms_norm, the many-row and few-row bodies): rows that share no
//   one stride, heads of a packed projection (QK-norm's q = qkv[:, :H*D].view(T, H, D)),
//   row r read (and written) at token r / H, head r % H, where they lie: y is new and
//   contiguous, or x itself (out=x). The fused add's residual arguments, which an rms_norm
//   call leaves unused, carry them: stride_r is x's step between heads and stride_ro the
//   heads H; stride_yh, the kernel's last but one, y's step between heads, and stride_wh,
//   its last, the weight's (N: a row a head; 0: one row for all). Compiled for the configs
//   rows of at most kHeadsMaxVecs vectors climb to, with a weight of x's dtype; wider head
//   rows, or another weight, are copied into rows first.
constexpr int kHeads = 512;
constexpr int kHeadsMaxVecs = 64;
// The variant bits by name, in bit order (bit i is 1 << i; "" for a bit not in use), for
// cuda_impl/configs.py: the one copy of them.
constexpr const char* kVariantNames[] = {"plain_loads", "lean_regs", "reread", "", "late_weight",
                                         "row_chunks", "whole_vectors", "staged_row"};
static_assert(kPlainLoads == 1 << 0 && kLeanRegs == 1 << 1 && kReread == 1 << 2 &&
                  kLateWeight == 1 << 4 &&
                  kRowChunks == 1 << 5 && kWholeVectors == 1 << 6 && kStagedRow == 1 << 7,
              "kVariantNames follows the bits");

constexpr int block_threads(int row_threads) { return row_threads < 128 ? 128 : row_threads; }
// The most CTAs a cluster of a config with this variant may have.
constexpr int max_ranks(int variant) {
  return (variant & kStagedRow) != 0 ? kMaxStagedRanks : kMaxClusterRanks;
}
// CTAs an SM the compiler must fit in registers: rms_norm's staged row's at 64 registers a
// thread (its slices live in shared memory; the general body it keeps for rows off the
// 16-byte grid would take more, one CTA an SM fewer); the reread body's at 1024 threads,
// two (32 registers), where the weight is x's dtype: left to itself the compiler chose 32
// there too but spilled 8 bytes for fp16 x, none when bound (with an fp32 weight the bound
// spills 12-20 bytes: left to the compiler, which takes 48); 0 for any other, which leaves
// the choice to the compiler as the one-argument form does (a 1 there cost registers and a
// CTA an SM: docs/notebook/06-wide-rows.md, v32). The fused add's staged configs hold twice
// the shared memory (two 256 x 8 CTAs an SM either way), and its general body spilled
// under 64 registers.
constexpr int min_blocks(int row_threads, int variant, bool fused, bool weight_as_x) {
  if ((variant & kReread) != 0 && block_threads(row_threads) == 1024 && weight_as_x) return 2;
  return (variant & kStagedRow) != 0 && !fused ? 65536 / (block_threads(row_threads) * 64) : 0;
}


// A launch config: ROW_THREADS threads a row, VPT 16-byte vectors a thread, or (cluster) a
// cluster of CTAs of ROW_THREADS threads sharing one row; VARIANT: the k* variant bits.
struct Config {
  int row_threads = 0;
  int vpt = 0;
  bool cluster = false;
  int variant = 0;
};

// ---- launch configuration --------------------------------------------------------------
// One table of rungs an op: a ladder is the rungs of one kind in order, and a row of at most
// max_vecs 16-byte vectors of x takes the first rung of its ladder that holds it. The
// default build compiles exactly the configs an op's rungs name (derived below), each for
// every dtype combination; a sweep build (RMSNORM_SWEEP_CONFIGS, see setup.py) adds the
// plain op's candidates harness.sweep times, reached only by rms_norm_with_config. Why each
// rung has its config: docs/notebook/01-why-the-defaults.md.
enum class Ladder {
  kMany16,     // 16-bit x, many rows
  kMany32,     // fp32 x, many rows
  kFew,        // fewer row groups than SMs (decode-sized calls): 1-2 vectors a thread
  kCluster16,  // rows wider than one CTA holds: a cluster's CTAs share the row (16-bit)
  kCluster32,  // ... (fp32)
  kRows16,     // 16-bit rows of whole aligned 16-byte vectors, many or few: one CTA a row
  kReread16,   // many 16-bit rows of whole aligned 16-byte vectors: one CTA a row, read twice
  kReread32,   // ... (fp32)
  kWhole,      // rows of whole aligned 16-byte vectors from the table's kWholeMinN16 /
               // kWholeMinN32 elements (32768, but many 16-bit rows of 32768, which
               // kReread16 takes first; the fused add's 16-bit rows from 20480)
  kOdd16,      // 16-bit rows off the 16-byte grid (N, or a row's start, not on it), many rows
};
// kRows16 takes rows of a whole number of this many vectors, so that every thread of a
// 256-thread CTA has the same vectors (the widths the sweep measured; 5120 elements, 640
// vectors, lost to the many-row ladder: docs/notebook/07-decode-and-host-time.md, v31).
constexpr int kRowChunkVecs = 512;
// kReread16 and kReread32 take rows of more than this many vectors (16-bit 4096, fp32
// 2048: narrower rows hold their vectors on the other ladders at the same speed, within the
// sweep's spread), and only many rows (at least one a SM; decode-sized calls keep theirs).
constexpr int kRereadMinVecs = 512;
// kOdd16 takes rows of more than this many vectors (the many-row rung below its first one;
// the band its sweep measured: 4095 and 4097 elements).
constexpr int kOddMinVecs = 256;
struct Rung {
  Ladder ladder;
  int max_vecs;  // widest row (16-byte vectors) it takes: a cluster rung at its most CTAs
  Config config;
};
constexpr int kPlain = kPlainLoads;
constexpr int kLean = kLeanRegs;
constexpr int kPlainLean = kPlainLoads | kLeanRegs;
constexpr int kPlainLate = kPlainLoads | kLateWeight;
// rows off the 16-byte grid in a staged whole-vector kernel take the general body, as lean
constexpr int kStagedWhole = kPlainLean | kWholeVectors | kStagedRow;

constexpr int kReadOnly = 0;  // read-only, non-allocating loads, no other bit

#define RUNG(ladder, max_vecs, row_threads, vpt, cluster, variant) \
  {Ladder::ladder, max_vecs, {row_threads, vpt, cluster != 0, variant}},
#define SWEEP(row_threads, vpt, cluster, variant)
// kWholeMinN16, kWholeMinN32: kWhole takes rows of at least this many 16-bit or fp32
// elements (the widths its sweeps measured; the fused add's 16-bit rows of 20480 and 24576
// on two staged CTAs, 99.0-99.1% of copy against 97.9-98.1 on one CTA of 512 x 8:
// docs/notebook/16-why-inductor-wins.md, v62).
struct PlainTable {
  static constexpr Rung kRungs[] = {
#include "tuning/rms_norm.inc"
  };
  static constexpr int kWholeMinN16 = 32768;
  static constexpr int kWholeMinN32 = 32768;
};
struct FusedTable {
  static constexpr Rung kRungs[] = {
#include "tuning/fused_add_rms_norm.inc"
  };
  static constexpr int kWholeMinN16 = 20480;
  static constexpr int kWholeMinN32 = 32768;
};
#undef RUNG
#undef SWEEP
#define RUNG(ladder, max_vecs, row_threads, vpt, cluster, variant)
#define SWEEP(row_threads, vpt, cluster, variant) Config{row_threads, vpt, cluster != 0, variant},
// A sweep build's extra candidates of each table (none in the default build).
template <typename Tb>
struct SweepOnly {
  static constexpr Config kConfigs[1] = {};
  static constexpr int kNum = 0;
};
#ifdef RMSNORM_SWEEP_CONFIGS
template <>
struct SweepOnly<PlainTable> {
  static constexpr Config kConfigs[] = {
#include "tuning/rms_norm.inc"
  };
  static constexpr int kNum = sizeof(kConfigs) / sizeof(Config);
};
template <>
struct SweepOnly<FusedTable> {
  static constexpr Config kConfigs[] = {
#include "tuning/fused_add_rms_norm.inc"
  };
  static constexpr int kNum = sizeof(kConfigs) / sizeof(Config);
};
#endif
#undef RUNG
#undef SWEEP


template <typename Tb>
constexpr int kNumRungs = sizeof(Tb::kRungs) / sizeof(Rung);

constexpr bool same(const Config& a, const Config& b) {
  return a.row_threads == b.row_threads && a.vpt == b.vpt && a.cluster == b.cluster &&
         a.variant == b.variant;
}

// Whether rung i is the first to name its config.
template <typename Tb>
constexpr bool first_use(int i) {
  for (int j = 0; j < i; ++j)
    if (same(Tb::kRungs[j].config, Tb::kRungs[i].config)) return false;
  return true;
}

template <typename Tb>
constexpr int count_shipped() {
  int n = 0;
  for (int i = 0; i < kNumRungs<Tb>; ++i) n += first_use<Tb>(i);
  return n;
}
template <typename Tb>
constexpr int kNumShipped = count_shipped<Tb>();
template <typename Tb>
constexpr int kNumConfigs = kNumShipped<Tb> + SweepOnly<Tb>::kNum;

// Every compiled config: the rungs' own (in rung order), then the sweep-only ones.
template <typename Tb>
constexpr std::array<Config, kNumConfigs<Tb>> all_configs() {
  std::array<Config, kNumConfigs<Tb>> all{};
  int n = 0;
  for (int i = 0; i < kNumRungs<Tb>; ++i)
    if (first_use<Tb>(i)) all[n++] = Tb::kRungs[i].config;
  for (int i = 0; i < SweepOnly<Tb>::kNum; ++i) all[n++] = SweepOnly<Tb>::kConfigs[i];
  return all;
}
template <typename Tb>
constexpr std::array<Config, kNumConfigs<Tb>> kConfigs = all_configs<Tb>();

// Index of a compiled config, or -1.
template <typename Tb>
constexpr int find_config(const Config& c) {
  for (int i = 0; i < kNumConfigs<Tb>; ++i)
    if (same(kConfigs<Tb>[i], c)) return i;
  return -1;
}

// Each rung's index into kConfigs, resolved at compile time.
template <typename Tb>
constexpr std::array<int, kNumRungs<Tb>> rung_configs() {
  std::array<int, kNumRungs<Tb>> idx{};
  for (int i = 0; i < kNumRungs<Tb>; ++i) idx[i] = find_config<Tb>(Tb::kRungs[i].config);
  return idx;
}
template <typename Tb>
constexpr std::array<int, kNumRungs<Tb>> kRungConfig = rung_configs<Tb>();

template <typename Tb>
constexpr bool valid_table() {
  for (int i = 0; i < kNumConfigs<Tb>; ++i)  // compiled once each
    for (int j = 0; j < i; ++j)
      if (same(kConfigs<Tb>[i], kConfigs<Tb>[j])) return false;
  for (int i = 0; i < kNumRungs<Tb>; ++i) {
    const Rung& r = Tb::kRungs[i];
    const int ranks = r.config.cluster ? max_ranks(r.config.variant) : 1;
    const bool any_row = (r.config.variant & kRowChunks) != 0;
    if (!any_row && r.config.row_threads * r.config.vpt * ranks < r.max_vecs) return false;
    for (int j = 0; j < i; ++j)  // a ladder's rungs grow
      if (Tb::kRungs[j].ladder == r.ladder && Tb::kRungs[j].max_vecs >= r.max_vecs) return false;
  }
  return true;
}
template <typename Tb>
constexpr bool no_launch_flags() {
  for (int i = 0; i < kNumConfigs<Tb>; ++i)
    if ((kConfigs<Tb>[i].variant & (kPlusOne | kHeads)) != 0) return false;
  return true;
}
static_assert(no_launch_flags<PlainTable>() && no_launch_flags<FusedTable>(),
              "kPlusOne and kHeads are a launch's flags, not a config's");
static_assert(valid_table<PlainTable>(),
              "each config compiled once; rungs hold their rows, in order");
static_assert(valid_table<FusedTable>(),
              "each config compiled once; rungs hold their rows, in order");

// ---- dispatch: one table of kernels a dtype combination, indexed like the op's configs ----
template <typename T, typename W, typename R>
using KernelFn = void (*)(const T*, const W*, T*, int64_t, int64_t, int, float, const R*, R*,
                          int64_t, int64_t, int64_t, int64_t, int64_t);

template <typename R>
using TableOf = std::conditional_t<std::is_void_v<R>, PlainTable, FusedTable>;

// Whether config i of table Tb is named by a rung of a ladder that rows of elem-byte
// elements climb (the fused add compiles each config only for the dtypes that reach it).
template <typename Tb>
constexpr bool used_by(int i, int elem) {
  const Ladder many = elem == 4 ? Ladder::kMany32 : Ladder::kMany16;
  const Ladder cluster = elem == 4 ? Ladder::kCluster32 : Ladder::kCluster16;
  for (int r = 0; r < kNumRungs<Tb>; ++r) {
    const Ladder l = Tb::kRungs[r].ladder;
    if ((l == many || l == cluster || l == Ladder::kFew || l == Ladder::kWhole ||
         l == (elem == 4 ? Ladder::kReread32 : Ladder::kReread16) ||
         ((l == Ladder::kOdd16 || l == Ladder::kRows16) && elem == 2)) &&
        same(Tb::kRungs[r].config, kConfigs<Tb>[i]))
      return true;
  }
  return false;
}


// Whether config i of table Tb is one a row of at most kHeadsMaxVecs vectors of elem-byte
// elements climbs to: a many-row or few-row rung (of elem's ladders) whose ladder's rung
// before it takes fewer vectors (kHeads' configs).
template <typename Tb>
constexpr bool takes_heads(int i, int elem) {
  const Ladder many = elem == 4 ? Ladder::kMany32 : Ladder::kMany16;
  for (int r = 0; r < kNumRungs<Tb>; ++r) {
    const Ladder l = Tb::kRungs[r].ladder;
    if ((l != many && l != Ladder::kFew) || !same(Tb::kRungs[r].config, kConfigs<Tb>[i])) continue;
    int below = 0;  // the widest row of the ladder's rung before this one
    for (int q = 0; q < r; ++q)
      if (Tb::kRungs[q].ladder == l) below = Tb::kRungs[q].max_vecs;
    if (below < kHeadsMaxVecs) return true;
  }
  return false;
}

}  // namespace
}  // namespace cuda_impl
