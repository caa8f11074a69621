// half.h — bf16 and fp16 <-> fp32 conversions on bit patterns (host side).
// bf16 is the top half of an fp32; fp16 is IEEE binary16 (5-bit exponent, bias 15, subnormals below 2^-14).
// Narrowing rounds to nearest, ties to even; overflow gives ±inf; NaN stays NaN (made quiet, sign and top payload
// kept).
// Widening is exact.
#pragma once
#include <stdint.h>
#include <string.h>

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040); // NaN: set the quiet bit
    u += 0x7fffu + ((u >> 16) & 1); // ties to even; carries into the exponent
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) return f32_from_bits(sign | 0x7f800000u | (m << 13)); // inf, NaN (payload kept)
    if (e) return f32_from_bits(sign | ((e + 112) << 23) | (m << 13));   // normal: rebias 15 -> 127
    if (!m) return f32_from_bits(sign);                                  // ±0
    int shift = 0;                                                       // subnormal: m·2^-24, normalise
    while (!(m & 0x400)) m <<= 1, shift++;
    return f32_from_bits(sign | ((uint32_t)(113 - shift) << 23) | ((m & 0x3ff) << 13));
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t u = f32_bits(f), ax = u & 0x7fffffffu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    if (ax > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff); // NaN: quiet, top payload kept
    if (ax >= 0x477ff000u) return sign | 0x7c00; // >= 65520 rounds to inf (65504 is the largest half)
    if (ax >= 0x38800000u) {                     // a normal half: |f| >= 2^-14
        ax += 0xfffu + ((ax >> 13) & 1);
        return sign | (uint16_t)((ax >> 13) - (112u << 10));
    }
    uint32_t e = ax >> 23; // a subnormal half (or zero): round |f| / 2^-24 to an integer
    if (e < 102) return sign;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u, s = 126 - e, q = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return sign | (uint16_t)q;
}
