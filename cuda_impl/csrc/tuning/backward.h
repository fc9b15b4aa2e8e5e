// The CUDA backward's launch choices, as data (both ops): read by rms_norm_backward.cu's
// rules (pick, pick_staged, staged_stages, by_threads), and nowhere else; a change here
// rebuilds that unit only. Why each value is what it is, with the measurements: the
// notebook entry each comment names: docs/notebook/05-the-backward.md (v14-v18),
// docs/notebook/13-the-cluster-backward-and-the-gluon-run.md (v43),
// docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md (v45-v51).
#pragma once

#include <climits>

namespace cuda_impl {
namespace bwd_tuning {

// 16-byte groups a thread holds of a staged row (the widest one CTA stages is 1024 threads'
// worth; the thread counts climb 64, 128, ... 1024) or of a register-resident one to 512
// threads' worth (wider: kRegWideVpt).
constexpr int kVpt = 2;
// Groups a thread of the register-resident kernel (fp32 rows to 8192)
// holds of rows wider than 512 threads of kVpt: 512 threads of 4. At fp32 8192 this and the
// weight in registers each measured faster than 1024 threads of 2, the two together faster
// still (docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v45).
constexpr int kRegWideVpt = 4;
// Threads a CTA of the register-resident kernel's cluster rows (the plain op's aligned fp32
// rows past 2048 groups; docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v50).
constexpr int kRegClusterThreads = 512;
// 16-bit rms_norm rows off a 16-byte boundary or of odd N whose aligned body is at most this
// many groups take the register-resident kernel (EDGES): 4095 / 4097 measured faster there
// than staged, with the edge loads last and more so with them first; the fused add's lost
// so, with the edge loads last and with them first (v51), and aligned 16-bit rows in
// registers lost from 4096 up, so wider odd rows stay staged
// (docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v46).
constexpr int kEdges16MaxGroups = 512;
// Elements a thread a chunk, for the chunked kernel's one-element groups (rows whose
// tensors differ in alignment).
constexpr int kScalarVpt = 4;
// Groups of the widest aligned rms_norm row the narrow kernel (several rows a CTA, a row's
// lanes within a warp) takes: 16-bit 512 columns, fp32 256 (QK-norm's head rows); not yet
// measured against the staged and register kernels past 128 columns.
constexpr int kNarrowMaxGroups = 64;
// Threads a block of the dweight reduction, and the loads of partials rows each keeps in
// flight (with blocks of 8-32 columns: faster at the narrow rows, where 8 warps of 4 loads
// over 32 columns had taken a share of the op's time;
// docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v47).
constexpr int kReduceThreads = 1024;
constexpr int kReduceUnroll = 8;
// Columns a block of the dweight reduction: the widest of kReduceMaxCols, half that, ...
// kReduceMinCols (32 bytes of a partials row) of whose blocks there are as many as SMs.
constexpr int kReduceMaxCols = 32;
constexpr int kReduceMinCols = 8;
// CTAs a cluster may hold for rows wider than one CTA stages: the portable size.
constexpr int kMaxClusterRanks = 8;
// A cluster's CTAs (rows wider than one CTA stages): threads a CTA and rows of its share of
// s and dy in shared memory, in the fewest CTAs (2, 4, 8) whose shares that holds. The plain
// op's rows measured faster as two 112 KB CTAs an SM with two rows ahead (kClusterCta) than
// as one 160 KB CTA with one (kClusterOneCta; v43), and the fused add's faster so once a
// row's sums went ahead of the previous row's wait (v50; with a cluster barrier a row it had
// lost so). Rows past those shares (fp32 65536's fused add), rows off a 16-byte boundary and
// 16-bit rows whose weight is not kept in T (128 KB, one CTA an SM), none of them measured
// so, take kClusterOneCta (docs/notebook/13-the-cluster-backward-and-the-gluon-run.md, v43;
// docs/notebook/14-the-narrow-backward-and-the-shared-dresidual.md, v50).
struct ClusterCta {
  int threads;
  int stages;
};
constexpr ClusterCta kClusterCta{512, 3};
constexpr ClusterCta kClusterOneCta{1024, 2};
// Shared memory left for the static part (the row sums, 2 floats a warp) under the opt-in
// most a CTA may ask for.
constexpr int kStaticSmemMargin = 1024;

// Rows of s and dy a CTA of the staged kernel keeps (the one reduced and the copies in
// flight), by the bytes of s and dy a row: the first entry whose max_row_bytes holds the row.
// The fewer bytes a row, the more rows ahead; the fused add, whose d_residual_out loads keep
// bytes in flight too, one fewer. Depths the kernel is not built for fall back to the next
// one built (rms_norm_backward.cu, staged_kernel).
struct Ring {
  int max_row_bytes;
  int plain;  // rms_norm
  int fused;  // fused_add_rms_norm
};
constexpr Ring kRings[] = {
    {16384, 4, 3},
    {32768, 3, 2},
    {INT_MAX, 2, 2},
};
// 16-bit rows off a 16-byte boundary: deeper rings only slowed them (their spare lanes).
// (fp32's, which kept one more, now take the register kernel or a cluster.)
constexpr int kUnalignedRing = 2;

// 16-bit rows off a 16-byte boundary of this many groups (N = 4095, 4097: 513) that stay
// staged (the fused add's; rms_norm's past kEdges16MaxGroups) take kOddThreads threads of
// kOddVpt groups, not 512 threads of kVpt with half their lanes idle: twice the CTAs an SM.
constexpr int kOddMinGroups = 513;
constexpr int kOddMaxGroups = 768;
constexpr int kOddThreads = 256;
constexpr int kOddVpt = 3;

// A 16-bit weight of dy's dtype stays in that dtype in the staged kernel's 2-row rings of
// aligned rows on more than this many threads (a cluster's CTAs always); on the deeper rings
// it spilled, and on rows off a 16-byte boundary it lost.
constexpr int kWeightInTMinThreads = 256;

}  // namespace bwd_tuning
}  // namespace cuda_impl
