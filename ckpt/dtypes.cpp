// Element types of the checkpoint files (checkpoint.h): their safetensors
// names and sizes, and the exact widening of the floating ones to F32.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "ckpt/checkpoint.h"
#include "zero/error.h"

namespace zero::ckpt {

namespace {


// float8 e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent
// 0 is subnormal (m/8 x 2^-6); S.1111.111 is NaN, and there is no infinity.
float f8_e4m3_to_f32(uint8_t b) {
  const int exp = (b >> 3) & 0xf, man = b & 0x7;
  float v;
  if (exp == 0xf && man == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -9);
  } else {
    v = std::ldexp(static_cast<float>(8 + man), exp - 10);
  }
  return (b & 0x80) ? -v : v;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf, nan (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal half: normalise; every one is a normal float.
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while ((man & 0x400u) == 0);
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F64: return "F64";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F8_E5M2: return "F8_E5M2";
  }
  return "?";
}

DType dtype_from_name(const std::string& s) {
  for (DType d : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64, DType::I32, DType::U8, DType::BOOL,
                  DType::F8_E4M3, DType::F8_E5M2})
    if (s == dtype_name(d)) return d;
  fail("unknown dtype \"" + s + "\"; this build reads F32, F16, BF16, F64, I64, I32, U8, BOOL, F8_E4M3, F8_E5M2");
}

size_t dtype_size(DType d) {
  switch (d) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::U8:
    case DType::BOOL:
    case DType::F8_E4M3:
    case DType::F8_E5M2: return 1;
  }
  return 0;
}

bool dtype_is_floating(DType d) {
  return d == DType::F32 || d == DType::F16 || d == DType::BF16 || d == DType::F64 || d == DType::F8_E4M3 ||
         d == DType::F8_E5M2;
}

void convert_to_f32(DType d, const void* src, size_t n, float* dst) {
  switch (d) {
    case DType::F32:
      if (n) std::memmove(dst, src, n * 4);
      return;
    case DType::F16: {
      const auto* s = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(static_cast<uint16_t>(s[2 * i] | (s[2 * i + 1] << 8)));
      return;
    }
    case DType::BF16: {
      const auto* s = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < n; ++i) {
        uint32_t bits = static_cast<uint32_t>(s[2 * i] | (s[2 * i + 1] << 8)) << 16;
        std::memcpy(&dst[i], &bits, 4);
      }
      return;
    }
    case DType::F64: {
      const auto* s = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, s + 8 * i, 8);
        dst[i] = static_cast<float>(v);
      }
      return;
    }
    case DType::F8_E4M3: {
      const auto* s = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f8_e4m3_to_f32(s[i]);
      return;
    }
    case DType::F8_E5M2: {
      const auto* s = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(static_cast<uint16_t>(s[i] << 8));
      return;
    }
    default: fail(std::string("cannot convert dtype ") + dtype_name(d) + " to F32: not a floating dtype");
  }
}

namespace {

// IEEE half, rounded to nearest, ties to even; NaN stays NaN, overflow is infinity.
uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  const int exponent = static_cast<int>(magnitude >> 23) - 127 + 15;
  if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exponent <= 0) {  // a half subnormal: |f| * 2^24 is exact, rounded to an even integer
    const float scaled = std::nearbyint(std::fabs(f) * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(scaled));
  }
  const uint32_t mantissa = magnitude & 0x7fffffu, rest = mantissa & 0x1fffu;
  uint32_t h = (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may reach infinity, as it should
  return static_cast<uint16_t>(sign | h);
}

}  // namespace

void convert_from_f32(DType d, const float* src, size_t n, void* dst) {
  switch (d) {
    case DType::F32:
      if (n) std::memmove(dst, src, n * 4);
      return;
    case DType::BF16: {
      auto* out = static_cast<unsigned char*>(dst);
      for (size_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &src[i], 4);
        // To nearest, ties to even, as torch rounds; a NaN stays a (quiet) NaN.
        const uint16_t b = (bits & 0x7fffffffu) > 0x7f800000u
                               ? static_cast<uint16_t>((bits >> 16) | 0x40)
                               : static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
        out[2 * i] = static_cast<unsigned char>(b & 0xff);
        out[2 * i + 1] = static_cast<unsigned char>(b >> 8);
      }
      return;
    }
    case DType::F16: {
      auto* out = static_cast<unsigned char*>(dst);
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16(src[i]);
        out[2 * i] = static_cast<unsigned char>(h & 0xff);
        out[2 * i + 1] = static_cast<unsigned char>(h >> 8);
      }
      return;
    }
    default: fail(std::string("cannot convert F32 to ") + dtype_name(d) + " (F32, BF16 and F16 only)");
  }
}

}  // namespace zero::ckpt
