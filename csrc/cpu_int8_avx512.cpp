// AVX512-VNNI int8 GEMM (compiled with -mavx512f -mavx512bw -mavx512vnni; only called after a
// run-time CPU check). It reads the same packed weight layout as the other paths (cpu_int8.h):
// two consecutive k pairs of a 16-column panel are 64 bytes, which one vpermw turns into 16
// int32 lanes of 4 k values each (lane j = column j), the operand shape of vpdpbusd.
//
// vpdpbusd multiplies *unsigned* bytes by signed bytes, four at a time, adding into int32 without
// saturation. A is made unsigned by flipping its sign bit (a ^ 0x80 == a + 128 for every int8,
// -128 included), and the excess is taken off per column: C = sum_k (a + 128) b - 128 sum_k b,
// with the last k block (pack_b stores 128 sum_k b after the panels). int32 arithmetic wraps,
// so the result is exact whenever the true product fits in int32 (|C| <= 128 * 128 * k:
// k < 131072), as on the other paths.
//
// Blocking: each thread owns a range of 16-column panels; within it, chunks of kNCp panels x kKC
// k values of the packed weights stay in L2 while kMR-row slices of A sweep past, two panels at a
// time (kMR x 2 zmm accumulators); the rows go in groups sized so the group's A stays in the
// cache. The first row slice of a chunk, which pulls it from memory, prefetches it ahead
// (without, that slice waited on DRAM latency: rows 8-256 at 4096 x 16384 and 12288 x 49152
// weights ran 1.1-2.9x slower on one Zen 5 core). A large int32 product with k in one block,
// stored past the caches, turns the order around (gemm_one_block_streamed): each panel pair
// meets every row slice of the group while in L1, and the tiles go from the accumulators
// straight to c. Up to stream_rows()
// rows of A (decode), gemm_small_m streams the weights instead: each pair of panels read once,
// prefetched ahead (into L2 or L1 by processor: DecodePrefetch), while every kMR-row slice of A
// multiplies it from cache.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "cpu_int8.h"

namespace kb {
namespace avx512vnni {
namespace {

constexpr int kMR = 12;    // rows of A per micro-kernel call (12 x 2 accumulators + 3 = 27 zmm)
// k values per block of the blocked path (a multiple of 4): a chunk of kNCp panels is then at
// most 512 KiB of B, and k up to 4096 is one block (no scratch summed across blocks). Against
// 2048 (paired in one process, Zen 5 VM, two threads, 2048 tokens, 8-15 reps a run): 0.949-0.968
// the time at 2048 x 3072 x 768 and 0.969-0.980 at 2048 x 4096 x 1024 (three runs), 0.975-0.997
// at 2048 x 2560 x 10240 (two), 0.967-0.998 at k = 6144-16384, 0.991-0.998 at 2048 x 5140 x
// 20560, 0.990-1.001 where k <= 2048 (one block either way). 8192: no better. Measured on Zen 5
// only.
constexpr int kKC = 4096;
// k values per block of the decode path past one row slice (see gemm_small_m).
constexpr int kDecodeKC = 2048;
constexpr int kNCp = 8;  // panels (of 16 columns) per L2 chunk: kNCp * kKC * 16 bytes of B
constexpr int kQuadBytes = kMR * 4;  // one quad of a packed row block of A
// When k is one block, every panel chunk sweeps the row group's whole A: in groups of 512 KiB
// it stays in L2 (1 MiB per core on Zen 4 and 5) beside the chunk instead of coming from L3.
// With pack_a's vector loop, against 2 MiB groups and the scalar loop (paired in one process,
// Zen 4 VM, two threads, ffn1 at 2048 tokens): 0.977 [0.972, 0.989] the time at d = 768, 0.982
// [0.978, 0.990] at 1024, 0.994 [0.989, 0.999] at 1536, 0.990 [0.982, 0.997] at 2048. Past one
// k block 512 KiB groups were slower (about 1.015x at d = 2560 and 5140 with 2048-value blocks:
// the weights are read once per group), so those keep kAGroupBytes. k = 2560-4096 became one
// block with kKC = 4096, its 512 KiB groups included in that change's figures.
constexpr int64_t kOneBlockAGroupBytes = int64_t{512} << 10;
// How far ahead (bytes of one panel) the decode path prefetches the weights: the hardware
// prefetcher stops at every 4 KiB page, and a panel of the decode path is one long stream.
constexpr int64_t kPrefetchBytes = 4096;

// Where a micro-kernel prefetches the weights it reads next: nowhere, into L1 (the blocked path's
// chunk, then read from L2 by every row slice) or into L2 (the decode path's one long stream on
// processors with DecodePrefetch::kL2). The decode stream into L2 instead of L1 (paired in one
// process, cold weights, Zen 4 VM, two threads): 0.86-0.95x the time at m = 1-8 and d =
// 1536-12288, 0.96-0.97x at m = 16-32 and d = 4096-12288 (0.99-1.00x at d = 2048); no prefetch at
// all: 0.86-1.10x, worse at m = 8; NTA: 0.99-1.02x. The blocked path into L2: 0.996-1.014x
// (m = 64-2048), so it stays at L1.
// kL2Pairs: into L2, for a kernel that reads its panel pair whole (decode, one row slice): past
// the end of its panels the prefetches go on into the thread's next pair (panels p + 2 and p + 3,
// next in memory), whose starts otherwise came on demand (stream 0 prefetched panel p + 1,
// already read by stream 1). Paired, cold weights, two threads, Zen 4 VM: 0.89-0.96x the time
// at m = 8 and 12 with d = 1536-4096 (shorter panels gain most), 0.99x at d = 12288; m = 1
// 0.96-1.00x. Then 1.00-1.15x the time of a plain read of the same bytes (torch.sum) at m = 1-12.
// Past the last pair it prefetches bytes nobody reads (a prefetch never faults). kL1Pairs: the
// same into L1 (DecodePrefetch::kL1, cpu_int8.h).
enum class Prefetch { kNone, kL1, kL2, kL2Pairs, kL1Pairs };

template <Prefetch PF>
inline void prefetch(const int8_t* p) {
  if constexpr (PF == Prefetch::kL2 || PF == Prefetch::kL2Pairs)
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
  else
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
}

// Where a kernel reading its panels from their start prefetches `offset` bytes past them: with
// kL2Pairs, past a panel's end it skips the other panel of its pair.
template <Prefetch PF>
inline int64_t prefetch_offset(int64_t offset, int64_t panel_bytes) {
  if constexpr (PF == Prefetch::kL2Pairs || PF == Prefetch::kL1Pairs)
    return offset < panel_bytes ? offset : offset + panel_bytes;
  return offset;
}

// Word index that interleaves the two k pairs of one 64-byte load: out words (2j, 2j+1) = in
// words (j, 16 + j), i.e. column j's k values (0, 1) then (2, 3).
inline __m512i pair_interleave() {
  alignas(64) static const int16_t idx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                              21, 6, 22, 7, 23, 8,  24, 9,  25, 10, 26,
                                              11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_load_si512(idx);
}

// acc += u8 a . s8 b, in place. Inline asm instead of _mm512_dpbusd_epi32: GCC 12 copied
// every accumulator to a fresh register (and the stack) around each intrinsic in the loop.
inline void dpbusd(__m512i& acc, __m512i a_u8, __m512i b_s8) {
  asm("vpdpbusd %[b], %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a_u8), [b] "v"(b_s8));
}

inline int32_t load4(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// How a micro-kernel puts its tile into C: overwrite, add to what is there (a later k block),
// or overwrite with non-temporal stores (whole 64-byte lines only, at 64-byte aligned rows; a
// partial last panel is stored as usual).
enum class Store { kOverwrite, kAccumulate, kStream };

// One quad of row r: acc(r, 0..NP-1) += A(r, 4q..4q+3) . B(panel, quad).
#define KB_QUAD(r, C0, C1)                                                  \
  if constexpr (R > r) {                                                    \
    const __m512i av = _mm512_set1_epi32(load4(a + q * kQuadBytes + r * 4)); \
    dpbusd(C0, av, b0);                                                     \
    if constexpr (NP > 1) dpbusd(C1, av, b1);                               \
  }
// Row r of the tile to C: acc - comp, + C when accumulating; the last panel masked to its columns.
#define KB_STORE(r, C0, C1)                                                 \
  if constexpr (R > r) {                                                    \
    int32_t* dst = c + r * ldc;                                             \
    store16(dst, C0, comp[0], NP == 1 ? last_mask : full, store);           \
    if constexpr (NP > 1) store16(dst + 16, C1, comp[1], last_mask, store); \
  }
#define KB_ROWS(M)                                                          \
  M(0, c00, c01) M(1, c10, c11) M(2, c20, c21) M(3, c30, c31)               \
  M(4, c40, c41) M(5, c50, c51) M(6, c60, c61) M(7, c70, c71)               \
  M(8, c80, c81) M(9, c90, c91) M(10, ca0, ca1) M(11, cb0, cb1)

inline void store16(int32_t* dst, __m512i acc, __m512i comp, __mmask16 mask, Store store) {
  __m512i v = _mm512_sub_epi32(acc, comp);
  if (store == Store::kStream && mask == 0xffff) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), v);
    return;
  }
  if (store == Store::kAccumulate) v = _mm512_add_epi32(v, _mm512_maskz_loadu_epi32(mask, dst));
  _mm512_mask_storeu_epi32(dst, mask, v);
}

// R x (16 * NP) tile of C (= or +=) sum over nq quads (plus a half quad) of A x NP panels,
// minus the panels' 128 * column sums `comp`. The accumulators are named variables and stored
// by name (with an array GCC kept them on the stack). PF: each quad also prefetches the bytes
// pf_offset past it in both panels (decode: its own panels ahead, or the next block's).
template <int R, int NP, Prefetch PF = Prefetch::kNone>
void micro_kernel(const uint8_t* a, const int8_t* bp, int64_t panel_bytes,
                  int64_t nq, bool half, const __m512i* comp, int32_t* c, int64_t ldc,
                  int last_cols, Store store, int64_t pf_offset) {
  static_assert(R >= 1 && R <= kMR && (NP == 1 || NP == 2), "tile shape");
  const __m512i idx = pair_interleave();
  const __m512i z = _mm512_setzero_si512();
  __m512i c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z;
  __m512i c40 = z, c41 = z, c50 = z, c51 = z, c60 = z, c61 = z, c70 = z, c71 = z;
  __m512i c80 = z, c81 = z, c90 = z, c91 = z, ca0 = z, ca1 = z, cb0 = z, cb1 = z;
  const int8_t* bp1 = bp + panel_bytes;
  const int64_t quads = nq + (half ? 1 : 0);
  for (int64_t q = 0; q < quads; ++q) {
    if constexpr (PF != Prefetch::kNone) {
      const int64_t ahead = prefetch_offset<PF>(pf_offset + q * 64, panel_bytes);
      prefetch<PF>(bp + ahead);
      if constexpr (NP > 1) prefetch<PF>(bp1 + ahead);
    }
    const __mmask64 lm = (half && q == nq) ? __mmask64(0xffffffffull) : ~__mmask64(0);
    const __m512i b0 = _mm512_permutexvar_epi16(idx, _mm512_maskz_loadu_epi8(lm, bp + q * 64));
    const __m512i b1 =
        NP > 1 ? _mm512_permutexvar_epi16(idx, _mm512_maskz_loadu_epi8(lm, bp1 + q * 64)) : z;
    KB_ROWS(KB_QUAD)
  }
  const __mmask16 full = 0xffff, last_mask = static_cast<__mmask16>((1u << last_cols) - 1u);
  KB_ROWS(KB_STORE)
}
#undef KB_ROWS
#undef KB_STORE
#undef KB_QUAD

// The one-row tile (a decode step). With one accumulator per panel, each vpdpbusd would wait
// for the previous one (latency, not throughput, bound), so four accumulators per panel take
// quads in turn and are summed at the end (int32 addition: exact, any order).
template <int NP, Prefetch PF = Prefetch::kNone>
void micro_kernel_row(const uint8_t* a, const int8_t* bp, int64_t panel_bytes, int64_t nq,
                      bool half, const __m512i* comp, int32_t* c, int64_t ldc, int last_cols,
                      Store store, int64_t pf_offset) {
  (void)ldc;
  const __m512i idx = pair_interleave();
  const __m512i z = _mm512_setzero_si512();
  __m512i s00 = z, s01 = z, s02 = z, s03 = z, s10 = z, s11 = z, s12 = z, s13 = z;
  const int8_t* bp1 = bp + panel_bytes;
#define KB_ROW_QUAD(u, S0, S1)                                                           \
  {                                                                                      \
    const __m512i av = _mm512_set1_epi32(load4(a + (q + u) * kQuadBytes));               \
    dpbusd(S0, av, _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(bp + (q + u) * 64))); \
    if constexpr (NP > 1)                                                                \
      dpbusd(S1, av, _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(bp1 + (q + u) * 64))); \
  }
  int64_t q = 0;
  for (; q + 4 <= nq; q += 4) {
    if constexpr (PF != Prefetch::kNone) {
      for (int u = 0; u < 4; ++u) {
        const int64_t ahead = prefetch_offset<PF>(pf_offset + (q + u) * 64, panel_bytes);
        prefetch<PF>(bp + ahead);
        if constexpr (NP > 1) prefetch<PF>(bp1 + ahead);
      }
    }
    KB_ROW_QUAD(0, s00, s10)
    KB_ROW_QUAD(1, s01, s11)
    KB_ROW_QUAD(2, s02, s12)
    KB_ROW_QUAD(3, s03, s13)
  }
  for (; q < nq; ++q) KB_ROW_QUAD(0, s00, s10)
#undef KB_ROW_QUAD
  if (half) {  // the last quad has only its first pair
    const __mmask64 lm = 0xffffffffull;
    const __m512i av = _mm512_set1_epi32(load4(a + nq * kQuadBytes));
    dpbusd(s01, av, _mm512_permutexvar_epi16(idx, _mm512_maskz_loadu_epi8(lm, bp + nq * 64)));
    if constexpr (NP > 1)
      dpbusd(s11, av, _mm512_permutexvar_epi16(idx, _mm512_maskz_loadu_epi8(lm, bp1 + nq * 64)));
  }
  const __mmask16 full = 0xffff, last_mask = static_cast<__mmask16>((1u << last_cols) - 1u);
  const __m512i t0 = _mm512_add_epi32(_mm512_add_epi32(s00, s01), _mm512_add_epi32(s02, s03));
  store16(c, t0, comp[0], NP == 1 ? last_mask : full, store);
  if constexpr (NP > 1) {
    const __m512i t1 = _mm512_add_epi32(_mm512_add_epi32(s10, s11), _mm512_add_epi32(s12, s13));
    store16(c + 16, t1, comp[1], last_mask, store);
  }
}

using KernelFn = void (*)(const uint8_t*, const int8_t*, int64_t, int64_t, bool,
                          const __m512i*, int32_t*, int64_t, int, Store, int64_t);

// The kernels of 1..kMR-row tiles of NP panels (1 row: the one-row kernel with its four chains).
using KernelRow = std::array<KernelFn, kMR>;

template <int NP, Prefetch PF, size_t... I>
constexpr KernelRow kernel_row(std::index_sequence<I...>) {
  return {{micro_kernel_row<NP, PF>, micro_kernel<static_cast<int>(I) + 2, NP, PF>...}};
}

template <Prefetch PF>
constexpr std::array<KernelRow, 2> kernel_table() {
  return {kernel_row<1, PF>(std::make_index_sequence<kMR - 1>{}),
          kernel_row<2, PF>(std::make_index_sequence<kMR - 1>{})};
}

// By Prefetch, panels - 1 and rows - 1.
const std::array<KernelRow, 2> kKernels[] = {
    kernel_table<Prefetch::kNone>(), kernel_table<Prefetch::kL1>(), kernel_table<Prefetch::kL2>(),
    kernel_table<Prefetch::kL2Pairs>(), kernel_table<Prefetch::kL1Pairs>()};

// The kernel of an R-row, np-panel tile.
KernelFn tile_kernel(int R, int np, Prefetch pf) {
  return kKernels[static_cast<int>(pf)][np - 1][R - 1];
}

// A block's quads q..q+15 of 4 rows (one zmm per row: its k values 4q..4q+63, sign bits
// flipped) into the packed layout: a 4 x 4 transpose of int32 within each 128-bit lane leaves
// vector j holding quads q + j, q + 4 + j, q + 8 + j, q + 12 + j of the four rows, 16 bytes each.
inline void store_quads_of_4_rows(uint8_t* d, __m512i r0, __m512i r1, __m512i r2, __m512i r3) {
  const __m512i t0 = _mm512_unpacklo_epi32(r0, r1), t1 = _mm512_unpackhi_epi32(r0, r1);
  const __m512i t2 = _mm512_unpacklo_epi32(r2, r3), t3 = _mm512_unpackhi_epi32(r2, r3);
  const __m512i v[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                        _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
  for (int j = 0; j < 4; ++j) {
    const auto at = [&](int lane) {
      return reinterpret_cast<__m128i*>(d + (4 * lane + j) * kQuadBytes);
    };
    _mm_storeu_si128(at(0), _mm512_castsi512_si128(v[j]));
    _mm_storeu_si128(at(1), _mm512_extracti32x4_epi32(v[j], 1));
    _mm_storeu_si128(at(2), _mm512_extracti32x4_epi32(v[j], 2));
    _mm_storeu_si128(at(3), _mm512_extracti32x4_epi32(v[j], 3));
  }
}

// A packed as unsigned bytes in row blocks of kMR: block b, quad q, row r at
// ((b * kq + q) * kMR + r) * 4, so a micro-kernel reads its rows' quads in one stream. The
// padding (rows past m, k values past k) is 0x80, i.e. a = 0. Every byte is written once (the
// buffer is not zeroed first); a full block's whole 64-byte runs of k go 16 quads x 4 rows at a
// time. Against the scalar loop into a zeroed buffer (Zen 4 VM, two threads), the GEMM of 2048
// x 768 x 32, mostly this packing, went from 2.40x oneDNN's time to 1.45x; 2048 x 768 x 3072
// and 2048 x 1024 x 4096 took about 0.993x the time.
struct PackedA {
  std::unique_ptr<uint8_t[]> bytes;
  const uint8_t* data() const { return bytes.get(); }
};

PackedA pack_a(const int8_t* a, int64_t m, int64_t k) {
  const int64_t kq = (k + 3) / 4, blocks = (m + kMR - 1) / kMR;
  const int64_t block_bytes = kq * kQuadBytes;
  PackedA ap{std::unique_ptr<uint8_t[]>(new uint8_t[static_cast<size_t>(blocks * block_bytes)])};
#pragma omp parallel for schedule(static) if (m * k > kSerialElems)
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* dst = ap.bytes.get() + b * block_bytes;
    int64_t q0 = 0;  // quads before q0 are packed for all kMR rows
    if (b * kMR + kMR <= m) {
      const __m512i flip = _mm512_set1_epi32(static_cast<int>(0x80808080u));
      const int8_t* src = a + b * kMR * k;
      for (; 4 * q0 + 64 <= k; q0 += 16)
        for (int g = 0; g < kMR / 4; ++g) {
          const int8_t* s = src + 4 * g * k + 4 * q0;
          store_quads_of_4_rows(dst + q0 * kQuadBytes + 16 * g,
                                _mm512_xor_si512(_mm512_loadu_si512(s), flip),
                                _mm512_xor_si512(_mm512_loadu_si512(s + k), flip),
                                _mm512_xor_si512(_mm512_loadu_si512(s + 2 * k), flip),
                                _mm512_xor_si512(_mm512_loadu_si512(s + 3 * k), flip));
        }
    }
    for (int r = 0; r < kMR; ++r) {
      const int64_t row = b * kMR + r;
      uint8_t* d = dst + r * 4;
      if (row >= m) {
        for (int64_t q = 0; q < kq; ++q) std::memset(d + q * kQuadBytes, 0x80, 4);
        continue;
      }
      const int8_t* src = a + row * k;
      int64_t q = q0;
      for (; 4 * q + 4 <= k; ++q) {
        uint32_t v;
        std::memcpy(&v, src + 4 * q, 4);
        v ^= 0x80808080u;
        std::memcpy(d + q * kQuadBytes, &v, 4);
      }
      for (; q < kq; ++q)
        for (int j = 0; j < 4; ++j) {
          const int64_t kidx = 4 * q + j;
          d[q * kQuadBytes + j] = kidx < k ? static_cast<uint8_t>(src[kidx]) ^ 0x80u : 0x80u;
        }
    }
  }
  return ap;
}

// float -> bf16 of 16 lanes, rounded to nearest even, NaN as 0x7fc0: the AVX2 set's cvt_bf16.
inline __m256i cvt_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  r = _mm512_srli_epi32(r, 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(r);  // every lane is below 2^16: truncation = saturation
}

template <DType D>
inline void store16_out(void* base, int64_t i, __m512 v) {
  if constexpr (D == DType::F32) {
    _mm512_storeu_ps(static_cast<float*>(base) + i, v);
  } else if constexpr (D == DType::F16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(base) + i),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(base) + i), cvt_bf16(v));
  }
}

// The AVX2 set's dequant_block_impl 16 columns at a time: the same float operations in the
// same order on each element, so the same bits. Rows on the float64-scale path and the last
// columns short of 16 go to the AVX2 code itself. Against the AVX2 epilogue in the GEMMs
// (paired in one process, Zen 5 VM, two threads, bf16 out with bias and two outlier columns):
// 0.960-0.988x the time at 2048 tokens (d = 768-2560), 0.970x at 256 x 1024 x 4096, 0.980x
// at 64 x 1536 x 6144; decode (rotating weights) 0.967-0.982x at m = 8, 0.99x at m = 32,
// level at m = 1.
template <DType D>
void dequant_block_impl(const Epilogue& e, const int32_t* acc, int64_t ld, int64_t r0,
                        int64_t rows, int64_t j0, int64_t j1) {
  const DequantArgs& d = e.d;
  const int64_t n = e.n;
  const float* cs = e.col_scale;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = r0 + i;
    const int32_t* ar = acc + i * ld - j0;  // ar[j] for j in [j0, j1)
    int64_t j = j0;
    if (e.cols_safe && scale_is_safe(d.row_absmax[r])) {
      const __m512 rs = _mm512_set1_ps(d.row_absmax[r]);
      const float* ox = d.outlier_x ? d.outlier_x + r * d.c : nullptr;
      for (; j + 16 <= j1; j += 16) {
        const __m512 scale = _mm512_mul_ps(rs, _mm512_loadu_ps(cs + j));
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(ar + j)), scale);
        if (d.bias) v = _mm512_add_ps(v, _mm512_loadu_ps(d.bias + j));
        for (int64_t o = 0; o < d.c; ++o)
          v = _mm512_fmadd_ps(_mm512_set1_ps(ox[o]), _mm512_loadu_ps(d.outlier_w + o * n + j), v);
        store16_out<D>(e.out, r * n + j, v);
      }
    }
    if (j < j1) avx2::dequantize_block(e, ar + j, ld, r, 1, j, j1);
  }
}

// Decode (0 < m <= stream_rows()): the weights stream from memory, each byte used by few rows,
// so each is read once. Each thread takes its range of panels two at a time (two sequential
// streams, prefetched ahead) and finishes kNCp panels at a time. With one row slice (m <= kMR)
// a panel pair is read over the whole k at once, its sums in registers throughout; with more,
// kDecodeKC k values at a time, which the first row slice pulls from memory and the others read
// from cache (over the whole k, the pair and all of A outgrow L2 at large k: at 32 x 12288 this
// halved the throughput). A full second slice prefetches the block read next meanwhile; a
// shorter one does not: it finishes too fast to hide the prefetches of a whole block, which then
// held it waiting on memory instead of overlapping the first slice's compute (m = 13-20 ran
// 1.06-1.23x the blocked path's time on one Zen 4 VM; without, 0.82-0.92x the time before at
// m = 13-20, unchanged at 24 and 32). The same exact integers as the blocked path. Against the
// (prefetching) blocked path on one Zen 5 core, CPU time: 0.93-0.94x the time at m = 1-8 with
// 12288 x 49152 weights, 0.98-0.99 with 4096 x 16384, 0.97-1.02 at m = 16-48 (so the crossover
// is flat there and stream_rows stays at the AVX2 set's 32).
void gemm_small_m(const int8_t* a, int64_t m, int64_t k, const int8_t* packed_b, int64_t n,
                  int32_t* c, const Epilogue* ep) {
  const PackedLayout L(n, k);
  const int64_t panel_bytes = L.panel_bytes();
  const int32_t* sums = reinterpret_cast<const int32_t*>(packed_b + L.sums_offset());
  const PackedA ap = pack_a(a, m, k);
  const int64_t block_bytes = (k + 3) / 4 * kQuadBytes;
  // One row slice reads each panel pair over the whole k: its prefetches run on into the next
  // pair. With more, kDecodeKC at a time, the second slice prefetches the next block.
  const int64_t kc_max = m > kMR ? kDecodeKC : k;
  const bool l1 = decode_prefetch() == DecodePrefetch::kL1;
  const Prefetch stream_hint = m > kMR ? (l1 ? Prefetch::kL1 : Prefetch::kL2)
                               : m > 1 ? (l1 ? Prefetch::kL1Pairs : Prefetch::kL2Pairs)
                                       : (l1 ? Prefetch::kNone : Prefetch::kL2Pairs);
  constexpr int64_t sld = kNCp * 16;
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t p0 = L.panels * t / T, p1 = L.panels * (t + 1) / T;
    std::vector<int32_t> tile(static_cast<size_t>(m * sld));
    for (int64_t pc0 = p0; pc0 < p1; pc0 += kNCp) {
      const int64_t pc1 = std::min(p1, pc0 + kNCp);
      for (int64_t p = pc0; p < pc1; p += 2) {
        const int np = static_cast<int>(std::min<int64_t>(2, pc1 - p));
        const int last_cols = static_cast<int>(std::min<int64_t>(16, n - (p + np - 1) * 16));
        for (int64_t k0 = 0; k0 < k; k0 += kc_max) {
          const int64_t kc = std::min(kc_max, k - k0), kp = (kc + 1) / 2;
          const bool last_block = k0 + kc_max >= k;
          __m512i comp[2];  // the correction, taken off with the last k block
          for (int i = 0; i < np; ++i)
            comp[i] = last_block ? _mm512_loadu_si512(sums + (p + i) * 16) : _mm512_setzero_si512();
          const int8_t* bp = packed_b + p * panel_bytes + k0 / 2 * PackedLayout::kPairBytes;
          // The block this thread reads next (of this pair, or the next pair's first), from bp;
          // a full second row slice prefetches it while it computes from cache.
          const bool has_next = !last_block || p + 2 < p1;
          const int64_t next_offset = !last_block
                                          ? kc / 2 * PackedLayout::kPairBytes
                                          : 2 * panel_bytes - k0 / 2 * PackedLayout::kPairBytes;
          for (int64_t r0 = 0; r0 < m; r0 += kMR) {
            const int R = static_cast<int>(std::min<int64_t>(kMR, m - r0));
            const bool pf = r0 == 0 || (r0 == kMR && R == kMR && has_next);
            const KernelFn kernel = tile_kernel(R, np, pf ? stream_hint : Prefetch::kNone);
            kernel(ap.data() + r0 / kMR * block_bytes + k0 / 4 * kQuadBytes, bp, panel_bytes,
                   kp / 2, kp % 2 != 0, comp, tile.data() + r0 * sld + (p - pc0) * 16, sld,
                   last_cols, k0 > 0 ? Store::kAccumulate : Store::kOverwrite,
                   r0 == 0 ? kPrefetchBytes : next_offset);
          }
        }
      }
      finish_tile(ep, dequantize_block, c, n, tile.data(), sld, 0, m, pc0 * 16,
                  std::min(n, pc1 * 16));
    }
  }
}

// Without an epilogue (int8_raw) the int32 product goes to memory whole; from
// streaming_store_bytes() on (prefill sizes) its 64-byte aligned rows are stored non-temporally,
// so that the stores do not first read every line of c into the cache.
inline void store_tile_streaming(int32_t* c, int64_t n, const int32_t* acc, int64_t ld,
                                 int64_t r0, int64_t rows, int64_t j0, int64_t j1) {
  const int64_t cols = j1 - j0;
  for (int64_t i = 0; i < rows; ++i) {
    int32_t* dst = c + (r0 + i) * n + j0;
    const int32_t* src = acc + i * ld;
    int64_t j = 0;
    if ((reinterpret_cast<uintptr_t>(dst) & 63) == 0)
      for (; j + 16 <= cols; j += 16)
        _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + j), _mm512_loadu_si512(src + j));
    if (j < cols) std::memcpy(dst + j, src + j, static_cast<size_t>(cols - j) * sizeof(int32_t));
  }
}

// The int32 product alone, k in one block (k <= kKC), stored non-temporally (at least
// streaming_store_bytes(), c's rows whole 64-byte lines): each panel pair, once read into L1,
// meets every row slice of the group (their packed A from L2) before the next pair, and the
// tiles go from the accumulators straight to c. The scratch path instead takes each row slice
// through every pair of its chunk, reading each pair from L2 again for every slice. Same
// integers. Against the scratch path (paired in one process, Zen 5 VM, two threads, 2048
// tokens, hot): 0.960-0.962x the time at 2048 x 768 x 3072, 2048 x 1024 x 4096 and 2048 x
// 1536 x 6144, 0.979-0.982x at 2048 x 2048 x 8192 and 2048 x 2560 x 10240, 0.979x and 0.962x
// at 2048 x 3072 x 768 and 2048 x 4096 x 1024. With cached stores this order writes each
// pair's column strip down every row of the group (32 KiB of dirty lines per pair at 256 x
// 1024 x 4096, beside the pair in L1): there the int32 product took 1.28-1.31 ms against
// 1.18-1.21 ms on the scratch path (cold, three alternating runs of each build; custom
// int8_raw / oneDNN 0.94-0.98 against 0.91-0.95), and with the epilogue the order was level
// (0.99-1.01x), so both stay on the scratch path.
void gemm_one_block_streamed(const PackedA& ap, int64_t m, int64_t k, const int8_t* packed_b,
                             int64_t n, int32_t* c) {
  const PackedLayout L(n, k);
  const int64_t panels = L.panels, panel_bytes = L.panel_bytes();
  const int32_t* sums = reinterpret_cast<const int32_t*>(packed_b + L.sums_offset());
  const int64_t block_bytes = (k + 3) / 4 * kQuadBytes, kp = (k + 1) / 2;
  const int64_t mc = row_group_rows(m, k, kMR, kOneBlockAGroupBytes);
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t p0 = panels * t / T, p1 = panels * (t + 1) / T;
    for (int64_t g0 = 0; g0 < m; g0 += mc) {
      const int64_t g1 = std::min(m, g0 + mc);
      for (int64_t p = p0; p < p1; p += 2) {
        const int np = static_cast<int>(std::min<int64_t>(2, p1 - p));
        __m512i comp[2];
        for (int i = 0; i < np; ++i) comp[i] = _mm512_loadu_si512(sums + (p + i) * 16);
        for (int64_t r0 = g0; r0 < g1; r0 += kMR) {
          const int R = static_cast<int>(std::min<int64_t>(kMR, g1 - r0));
          // the group's first slice reads the pair from memory: it prefetches ahead
          const KernelFn kernel = tile_kernel(R, np, r0 == g0 ? Prefetch::kL1 : Prefetch::kNone);
          kernel(ap.data() + r0 / kMR * block_bytes, packed_b + p * panel_bytes, panel_bytes,
                 kp / 2, kp % 2 != 0, comp, c + r0 * n + p * 16, n, 16, Store::kStream,
                 kPrefetchBytes);
        }
      }
    }
    _mm_sfence();  // the streamed stores are visible after the region
  }
}

}  // namespace

void gemm_s8s8s32(const int8_t* a, int64_t m, int64_t k, const int8_t* packed_b, int64_t n,
                  int32_t* c, const Epilogue* ep) {
  if (m > 0 && m <= stream_rows()) return gemm_small_m(a, m, k, packed_b, n, c, ep);
  const PackedA ap = pack_a(a, m, k);
  const bool streamed = !ep && m * n * int64_t{4} >= streaming_store_bytes();
  const bool whole_lines = n % 16 == 0 && (reinterpret_cast<uintptr_t>(c) & 63) == 0;
  if (k <= kKC && streamed && whole_lines)
    return gemm_one_block_streamed(ap, m, k, packed_b, n, c);
  const PackedLayout L(n, k);
  const int64_t panels = L.panels, panel_bytes = L.panel_bytes();
  // 128 x each column's sum over k, after the panels
  const int32_t* sums = reinterpret_cast<const int32_t*>(packed_b + L.sums_offset());
  const int64_t block_bytes = (k + 3) / 4 * kQuadBytes;
  // The rows go in groups whose packed A stays in the cache (row_group_rows). Each thread sums
  // into a scratch of its current panel chunk (kMR rows when k is one block, else the group's mc
  // rows), finished as soon as a row slice's last k block is in: dequantized (dequantize_block;
  // the int32 product never goes to memory whole) or, without an epilogue, copied to c. Both
  // paths run the same blocking.
  const int64_t mc = row_group_rows(m, k, kMR, k <= kKC ? kOneBlockAGroupBytes : kAGroupBytes);
  const int64_t sld = kNCp * 16, srows = k > kKC ? std::min(mc, m) : kMR;
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t p0 = panels * t / T, p1 = panels * (t + 1) / T;
    __m512i comp[kNCp];
    std::vector<int32_t> scratch(static_cast<size_t>(srows * sld));
    for (int64_t g0 = 0; g0 < m; g0 += mc) {
      const int64_t g1 = std::min(m, g0 + mc);
      for (int64_t pc0 = p0; pc0 < p1; pc0 += kNCp) {
        const int64_t pc1 = std::min(p1, pc0 + kNCp);
        for (int64_t k0 = 0; k0 < k; k0 += kKC) {
          const int64_t kc = std::min<int64_t>(kKC, k - k0), kp = (kc + 1) / 2;
          const int64_t nq = kp / 2;
          const bool half = kp % 2 != 0;
          const int8_t* block = packed_b + L.offset(0, k0);  // + p * panel_bytes for panel p
          // The correction is taken off once, with the last k block (pack_b's column sums).
          const bool last_block = k0 + kKC >= k;
          for (int64_t p = pc0; p < pc1; ++p)
            comp[p - pc0] = last_block ? _mm512_loadu_si512(sums + p * 16) : _mm512_setzero_si512();
          for (int64_t r0 = g0; r0 < g1; r0 += kMR) {
            const int R = static_cast<int>(std::min<int64_t>(kMR, g1 - r0));
            int32_t* tile = scratch.data() + (srows == kMR ? 0 : r0 - g0) * sld;
            for (int64_t p = pc0; p < pc1; p += 2) {
              const int np = static_cast<int>(std::min<int64_t>(2, pc1 - p));
              const int last_cols = static_cast<int>(std::min<int64_t>(16, n - (p + np - 1) * 16));
              const KernelFn kernel =
                  tile_kernel(R, np, r0 == g0 ? Prefetch::kL1 : Prefetch::kNone);
              kernel(ap.data() + r0 / kMR * block_bytes + k0 / 4 * kQuadBytes,
                     block + p * panel_bytes, panel_bytes, nq, half, comp + (p - pc0),
                     tile + (p - pc0) * 16, sld, last_cols,
                     k0 > 0 ? Store::kAccumulate : Store::kOverwrite, kPrefetchBytes);
            }
            if (last_block) {
              if (streamed)
                store_tile_streaming(c, n, tile, sld, r0, R, pc0 * 16, std::min(n, pc1 * 16));
              else
                finish_tile(ep, dequantize_block, c, n, tile, sld, r0, R, pc0 * 16,
                            std::min(n, pc1 * 16));
            }
          }
        }
      }
    }
    if (streamed) _mm_sfence();  // the streamed stores are visible after the region
  }
}

void dequantize_block(const Epilogue& e, const int32_t* acc, int64_t ld, int64_t r0,
                      int64_t rows, int64_t j0, int64_t j1) {
  switch (e.out_dt) {
    case DType::F32: return dequant_block_impl<DType::F32>(e, acc, ld, r0, rows, j0, j1);
    case DType::F16: return dequant_block_impl<DType::F16>(e, acc, ld, r0, rows, j0, j1);
    default: return dequant_block_impl<DType::BF16>(e, acc, ld, r0, rows, j0, j1);
  }
}

void dequantize(const int32_t* acc, int64_t m, int64_t n, const DequantArgs& d, void* out,
                DType out_dt) {
  dequantize_rows(acc, m, n, d, out, out_dt, dequantize_block);
}

}  // namespace avx512vnni
}  // namespace kb
