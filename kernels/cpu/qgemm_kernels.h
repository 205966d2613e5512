// Serving Cost Lab -- weight-only quantized CPU GEMV / small-M GEMM kernels.
//
// Plain C++ interface shared by the ISA-specific translation units
// (qgemm_scalar.cpp, qgemm_avx2.cpp, qgemm_avx512.cpp) and the torch binding
// (qgemm.cpp).  No torch headers here so the SIMD files compile fast.
//
// Packed ("tiled") weight layouts -- produced by engine/ops/prepared.py
// prepare_int8 / prepare_int4, see docs/KERNELS.md:
//
//   rows are grouped in tiles of TILE = 64 output rows (N padded to a multiple
//   of 64 with zero rows).
//
//   int8:  w8[t][o][r][i]        int8,  t < NT, o < Kq/4, r < 64, i < 4: q[64t + r, 4o + i]
//          (Kq = K rounded up to 32, zero past K).  A SIMD load of 4W bytes
//          holds 4 consecutive k of W consecutive output rows, one row per
//          32-bit lane: what VPDPBUSD / VPMADDUBSW+VPMADDWD multiply by 4
//          broadcast int8 activations; the fp32 kernels take byte i of each
//          lane with two shifts.  One 256-byte run is quad o of a tile.
//          scale8[t*64 + r]      float32 per-output-channel scale.
//
//   int4:  w4[t][o][r]           uint32, o < Kp/8 (Kp = G*gs, K padded to the
//          group size); dword (t,o,r) holds the 8 values q[n, 8o .. 8o+7] of row
//          n = 64t + r as: byte i (i < 4) = q[n, 8o+i] | q[n, 8o+4+i] << 4, i.e.
//          nibble position p = 2i holds k = 8o+i and p = 2i+1 holds k = 8o+4+i.
//          This order serves both kernels: the fp32 kernels isolate nibble p with
//          one AND (the k permutation is absorbed into the activation copy xp),
//          and the VNNI kernel gets 16 rows x 4 consecutive k as bytes with one
//          AND (low nibbles) or a shift + AND (high nibbles).
//          sm4[t][g][0][r] = scale (fp16 bits), sm4[t][g][1][r] = min (fp16).
//
// Decoding trick (fp32 int4 kernels): nibble position p is isolated with one AND
// (mask 0xF << 4p), which yields the integer q * 16^p; after int->float
// conversion (exact) the 16^-p factor is folded into the activation copy,
// xp[m][8o+p] = x[m][8o+k(p)] * 16^-p (exact power-of-two scaling).  Position 7
// uses a logical shift by 28 instead (the masked value would be negative as
// int32), so its factor is 1.
// Per group:  y += scale * sum_k q*x  +  min * sum_k x   (sum_k x = xsum).
#pragma once
#include <cstdint>

namespace scl {

constexpr int TILE = 64;      // output rows per packed tile
constexpr int MAX_M = 64;     // largest M the small-M kernels accept
constexpr int KB8 = 256;      // k-block (int8) when several m-blocks share weights in L1
constexpr int KB4 = 256;      // k-block (int4), rounded to a whole number of groups

struct Int8Params {
  const int8_t* w;      // [NT][Kq/4][64][4]
  const float* scale;   // [NT*64]
  const float* bias;    // [N] or nullptr
  const float* x;       // [M][K]
  float* y;             // [M][N]
  int64_t M, N, K, Kq;
};

// int8 weights x int8-quantized activations (the activations as Int4Q8Params quantizes them).
// Every ISA computes, per output row, the same float steps in the same order (bit-identical):
//   acc = 0;  for each 32-k block b:  acc = fma(float(sum_k w*xq), sx[b], acc);
//   y = fma(acc, scale, bias or 0)          (the block sums are exact int32)
struct Int8Q8Params {
  const int8_t* w;      // [NT][Kq/4][64][4] (as Int8Params)
  const float* scale;   // [NT*64]
  const float* bias;    // [N] or nullptr
  const int8_t* xq;     // [M][ldq] quantized activations, 0 for k >= K
  const float* sx;      // [M][ldq/32] activation scales
  const int32_t* bsum;  // [M][ldq/32] sum of xq over each 32-k block
  float* y;             // [M][N]
  int64_t M, N, Kq, ldq;   // ldq >= Kq, a multiple of 32 (the fused step's rows are padded to a group)
};

struct Int4Params {
  const uint32_t* w;    // [NT][Kp/8][64]
  const uint16_t* sm;   // [NT][G][2][64] fp16 bits
  const float* bias;    // [N] or nullptr
  const float* xp;      // [M][Kp] pre-scaled activations, zero for k >= K
  const float* xsum;    // [M][G] per-group sum of the (unscaled) activations
  float* y;             // [M][N]
  int64_t M, N, K, Kp, G, gs;
};

// int4 weights x int8-quantized activations (opt-in, AVX-512 VNNI).  Activations
// are quantized per row and per block of 32 k: x ~= xq * sx, xq in [-127, 127].
struct Int4Q8Params {
  const uint32_t* w;    // [NT][Kp/8][64] (same layout as Int4Params)
  const uint16_t* sm;   // [NT][G][2][64] fp16 bits
  const float* bias;    // [N] or nullptr
  const int8_t* xq;     // [M][Kp] quantized activations, natural k order, 0 for k >= K
  const float* sx;      // [M][Kp/32] activation scales
  const int32_t* bsum;  // [M][Kp/32] sum of xq over each 32-k block
  const float* xsum;    // [M][G] per-group sum of the (unquantized) activations
  float* y;             // [M][N]
  int64_t M, N, K, Kp, G, gs;
};

// Each entry point computes output tiles [tile_begin, tile_end) for all M rows.
namespace scalar {
void int8_tiles(const Int8Params& p, int64_t tile_begin, int64_t tile_end);
void int4_tiles(const Int4Params& p, int64_t tile_begin, int64_t tile_end);
}
namespace avx2 {
bool compiled();
void int8_tiles(const Int8Params& p, int64_t tile_begin, int64_t tile_end);
void int4_tiles(const Int4Params& p, int64_t tile_begin, int64_t tile_end);
}
namespace avx512 {
bool compiled();
void int8_tiles(const Int8Params& p, int64_t tile_begin, int64_t tile_end);
void int4_tiles(const Int4Params& p, int64_t tile_begin, int64_t tile_end);
void int4q8_tiles(const Int4Q8Params& p, int64_t tile_begin, int64_t tile_end);  // needs VNNI
}
namespace scalar {
void int4q8_tiles(const Int4Q8Params& p, int64_t tile_begin, int64_t tile_end);  // reference
void int8q8_tiles(const Int8Q8Params& p, int64_t tile_begin, int64_t tile_end);  // reference
}
namespace avx512 {
void int8q8_tiles(const Int8Q8Params& p, int64_t tile_begin, int64_t tile_end);  // needs VNNI
}
namespace avx2 {
// int8 activations without VNNI: vpmaddubsw (u8 x s8 pairs -> int16, exact for q <= 15 and
// |xq| <= 127: 8 products per 32-k block per lane stay below 2^15) + vpmaddwd into int32.
void int4q8_tiles(const Int4Q8Params& p, int64_t tile_begin, int64_t tile_end);
// int8 weights: |w| (VPABSB) times xq carrying w's sign (VPSIGNB) by vpmaddubsw: a pair is at
// most 2 * 128 * 127 = 32512 < 2^15, exact; vpmaddwd (x 1) widens each quad to int32.
void int8q8_tiles(const Int8Q8Params& p, int64_t tile_begin, int64_t tile_end);
}

// The int8-activation tile kernels for an ISA level, one choice for the per-op kernels and the fused step:
// 2 with VNNI = VPDPBUSD; 2 without VNNI, or 1 = AVX2's vpmaddubsw; 0 = the portable reference.
struct Q8Tiles {
  void (*int4)(const Int4Q8Params&, int64_t, int64_t);
  void (*int8)(const Int8Q8Params&, int64_t, int64_t);
};
inline Q8Tiles q8_tiles(int64_t isa, bool vnni) {
  if (isa == 2 && vnni) return {avx512::int4q8_tiles, avx512::int8q8_tiles};
  if (isa >= 1) return {avx2::int4q8_tiles, avx2::int8q8_tiles};
  return {scalar::int4q8_tiles, scalar::int8q8_tiles};
}

// ---- activation preparation (one implementation, used by the per-op kernels and the fused step)
// Over k in [k0, k1) (multiples of 32) of one activation row x holding K valid values (zero
// beyond K, up to the padded Kp):
//   prep_xp: xp[k] = the nibble-ordered, 16^-p pre-scaled copy the fp32 int4 kernels read;
//   prep_q8: xq[k] int8, sx[b] scale, bsum[b] sum of xq, for each 32-k block b = k / 32;
//   both:    fsum[b] = sum of x over block b in one canonical order (8 lanes of 4, then a tree),
//            identical on every ISA, so the group sums (xsum_from_fsum) are too.
// Indices are absolute: xp/xq by k, sx/bsum/fsum by block.
#define SCL_DECLARE_PREP                                                                   \
  void prep_xp(const float* x, int64_t K, int64_t k0, int64_t k1, float* xp, float* fsum); \
  void prep_q8(const float* x, int64_t K, int64_t k0, int64_t k1, int8_t* xq, float* sx,   \
               int32_t* bsum, float* fsum);
namespace scalar { SCL_DECLARE_PREP }
namespace avx2 { SCL_DECLARE_PREP }
namespace avx512 { SCL_DECLARE_PREP }
#undef SCL_DECLARE_PREP

// Per-group sums of the activations from the per-32-block sums (sequential over the blocks).
inline void xsum_from_fsum(const float* fsum, int64_t G, int64_t gs, float* xsum) {
  const int64_t nb = gs / 32;
  for (int64_t g = 0; g < G; ++g) {
    float s = 0.f;
    for (int64_t b = 0; b < nb; ++b) s += fsum[g * nb + b];
    xsum[g] = s;
  }
}

// fp16 bits -> float (portable, used by the scalar path and dequantizers).
inline float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400u));
      man &= 0x3FFu;
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

}  // namespace scl
