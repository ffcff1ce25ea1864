#include "runtime/kv/block_codec.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "runtime/kv/turbo_quant.h"

namespace tierlm::kv {

namespace {

constexpr int kMaxDim = 1024;

template <class T> T* at(uint8_t* base, size_t offset) { return reinterpret_cast<T*>(base + offset); }
template <class T> const T* at(const uint8_t* base, size_t offset) {
  return reinterpret_cast<const T*>(base + offset);
}

// Sets bit `bit` of a plane word to `on`; other positions of the panel may be written by other threads.
void set_plane_bit(uint16_t* word, int bit, bool on) {
  std::atomic_ref<uint16_t> ref(*word);
  const uint16_t mask = uint16_t(1u << bit);
  if (on)
    ref.fetch_or(mask, std::memory_order_relaxed);
  else
    ref.fetch_and(uint16_t(~mask), std::memory_order_relaxed);
}

// q8: per block of dims, scale = max|x| / 127, stored as f16; codes use the rounded scale so decode is exact to it.
void quantize_q8(const float* x, int n, int8_t* codes, int code_stride, uint16_t* scale_out) {
  float amax = 0;
  for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  const uint16_t h = to_half(amax / 127.0f);
  const float scale = from_half(h);
  const float inv = scale > 0 ? 1.0f / scale : 0.0f;
  for (int j = 0; j < n; ++j)
    codes[j * code_stride] = int8_t(std::clamp(std::lround(x[j] * inv), -127l, 127l));
  *scale_out = h;
}

// Normalizes, rotates and Lloyd-Max-quantizes x: codes[d], returns the norm; unit_rotated/centroid_part get
// R x / ||x|| and its reconstruction (both unit-scale, coordinates ~ N(0, 1/d)).
float turbo_quantize(const TurboTables& T, const float* x, int bits, uint8_t* codes, float* unit_rotated,
                     float* centroid_part) {
  const int d = T.head_dim();
  double ss = 0;
  for (int j = 0; j < d; ++j) ss += double(x[j]) * x[j];
  const float norm = float(std::sqrt(ss));
  float unit[kMaxDim];
  const float inv = norm > 0 ? 1.0f / norm : 0.0f;
  for (int j = 0; j < d; ++j) unit[j] = x[j] * inv;
  T.rotate(unit, unit_rotated);
  const float root = std::sqrt(float(d)), inv_root = 1.0f / root;
  const auto& c = T.centroids(bits);
  for (int j = 0; j < d; ++j) {
    codes[j] = uint8_t(T.quantize(unit_rotated[j] * root, bits));
    centroid_part[j] = c[codes[j]] * inv_root;
  }
  return norm;
}

}  // namespace

void encode_key(const CodecLayout& L, uint8_t* region, int slot, const float* k) {
  const int d = L.head_dim, p = slot / kPanel, lane = slot % kPanel;
  switch (L.codec) {
    case Codec::f32:
      for (int j = 0; j < d; ++j) at<float>(region, 0)[(size_t(p) * d + j) * kPanel + lane] = k[j];
      return;
    case Codec::f16:
      for (int j = 0; j < d; ++j) at<uint16_t>(region, 0)[(size_t(p) * d + j) * kPanel + lane] = to_half(k[j]);
      return;
    case Codec::q8: {
      const int nb = d / L.q8_block;
      for (int b = 0; b < nb; ++b)
        quantize_q8(k + b * L.q8_block, L.q8_block,
                    at<int8_t>(region, 0) + (size_t(p) * d + size_t(b) * L.q8_block) * kPanel + lane, kPanel,
                    at<uint16_t>(region, L.key_scales) + (size_t(p) * nb + b) * kPanel + lane);
      return;
    }
    case Codec::turbo3:
    case Codec::turbo4: break;
  }
  const TurboTables& T = TurboTables::get(d);
  uint8_t codes[kMaxDim];
  float rotated[kMaxDim], mse[kMaxDim], residual[kMaxDim], projected[kMaxDim];
  const int bits = L.turbo.key_bits;
  const float norm = turbo_quantize(T, k, bits, codes, rotated, mse);
  uint16_t* planes = at<uint16_t>(region, 0) + size_t(p) * d * L.key_words;
  for (int j = 0; j < d; ++j)
    for (int w = 0; w < bits; ++w) set_plane_bit(planes + size_t(j) * L.key_words + w, lane, (codes[j] >> w) & 1);
  at<uint16_t>(region, L.key_norms)[slot] = to_half(norm);
  if (!L.turbo.key_qjl) return;
  double rs = 0;
  for (int j = 0; j < d; ++j) {
    residual[j] = rotated[j] - mse[j];
    rs += double(residual[j]) * residual[j];
  }
  T.project(residual, projected);
  for (int j = 0; j < d; ++j) set_plane_bit(planes + size_t(j) * L.key_words + bits, lane, projected[j] >= 0);
  at<uint16_t>(region, L.key_residual_norms)[slot] = to_half(float(std::sqrt(rs)));
}

void encode_value(const CodecLayout& L, uint8_t* region, int slot, const float* v) {
  const int d = L.head_dim;
  switch (L.codec) {
    case Codec::f32: std::memcpy(at<float>(region, 0) + size_t(slot) * d, v, size_t(d) * 4); return;
    case Codec::f16:
      for (int j = 0; j < d; ++j) at<uint16_t>(region, 0)[size_t(slot) * d + j] = to_half(v[j]);
      return;
    case Codec::q8: {
      const int nb = d / L.q8_block;
      for (int b = 0; b < nb; ++b)
        quantize_q8(v + b * L.q8_block, L.q8_block, at<int8_t>(region, 0) + size_t(slot) * d + b * L.q8_block, 1,
                    at<uint16_t>(region, L.value_scales) + size_t(slot) * nb + b);
      return;
    }
    case Codec::turbo3:
    case Codec::turbo4: break;
  }
  const TurboTables& T = TurboTables::get(d);
  uint8_t codes[kMaxDim];
  float rotated[kMaxDim], mse[kMaxDim];
  const int bits = L.turbo.value_bits;
  const float norm = turbo_quantize(T, v, bits, codes, rotated, mse);
  uint16_t* planes = at<uint16_t>(region, 0) + size_t(slot) * (d / 16) * bits;
  for (int c = 0; c < d / 16; ++c)
    for (int w = 0; w < bits; ++w) {
      uint16_t word = 0;
      for (int i = 0; i < 16; ++i) word |= uint16_t(((codes[16 * c + i] >> w) & 1) << i);
      planes[c * bits + w] = word;
    }
  at<uint16_t>(region, L.value_norms)[slot] = to_half(norm);
}

void decode_key(const CodecLayout& L, const uint8_t* region, int slot, float* k) {
  const int d = L.head_dim, p = slot / kPanel, lane = slot % kPanel;
  switch (L.codec) {
    case Codec::f32:
      for (int j = 0; j < d; ++j) k[j] = at<float>(region, 0)[(size_t(p) * d + j) * kPanel + lane];
      return;
    case Codec::f16:
      for (int j = 0; j < d; ++j) k[j] = from_half(at<uint16_t>(region, 0)[(size_t(p) * d + j) * kPanel + lane]);
      return;
    case Codec::q8:
      for (int j = 0; j < d; ++j) {
        const int b = j / L.q8_block, nb = d / L.q8_block;
        k[j] = float(at<int8_t>(region, 0)[(size_t(p) * d + j) * kPanel + lane]) *
               from_half(at<uint16_t>(region, L.key_scales)[(size_t(p) * nb + b) * kPanel + lane]);
      }
      return;
    case Codec::turbo3:
    case Codec::turbo4: break;
  }
  const TurboTables& T = TurboTables::get(d);
  const int bits = L.turbo.key_bits;
  const auto& c = T.centroids(bits);
  const uint16_t* planes = at<uint16_t>(region, 0) + size_t(p) * d * L.key_words;
  float rotated[kMaxDim], signs[kMaxDim], back[kMaxDim];
  const float inv_root = 1.0f / std::sqrt(float(d));
  for (int j = 0; j < d; ++j) {
    int code = 0;
    for (int w = 0; w < bits; ++w) code |= ((planes[size_t(j) * L.key_words + w] >> lane) & 1) << w;
    rotated[j] = c[size_t(code)] * inv_root;
  }
  if (L.turbo.key_qjl) {
    const float rn = from_half(at<uint16_t>(region, L.key_residual_norms)[slot]);
    const float gain = rn * std::sqrt(float(M_PI) / 2.0f) / float(d);
    for (int j = 0; j < d; ++j) signs[j] = ((planes[size_t(j) * L.key_words + bits] >> lane) & 1) ? 1.0f : -1.0f;
    float estimate[kMaxDim];
    T.project_transposed(signs, estimate);
    for (int j = 0; j < d; ++j) rotated[j] += gain * estimate[j];
  }
  T.unrotate(rotated, back);
  const float norm = from_half(at<uint16_t>(region, L.key_norms)[slot]);
  for (int j = 0; j < d; ++j) k[j] = back[j] * norm;
}

void decode_value(const CodecLayout& L, const uint8_t* region, int slot, float* v) {
  const int d = L.head_dim;
  switch (L.codec) {
    case Codec::f32: std::memcpy(v, at<float>(region, 0) + size_t(slot) * d, size_t(d) * 4); return;
    case Codec::f16:
      for (int j = 0; j < d; ++j) v[j] = from_half(at<uint16_t>(region, 0)[size_t(slot) * d + j]);
      return;
    case Codec::q8:
      for (int j = 0; j < d; ++j) {
        const int nb = d / L.q8_block;
        v[j] = float(at<int8_t>(region, 0)[size_t(slot) * d + j]) *
               from_half(at<uint16_t>(region, L.value_scales)[size_t(slot) * nb + j / L.q8_block]);
      }
      return;
    case Codec::turbo3:
    case Codec::turbo4: break;
  }
  const TurboTables& T = TurboTables::get(d);
  const int bits = L.turbo.value_bits;
  const auto& c = T.centroids(bits);
  const uint16_t* planes = at<uint16_t>(region, 0) + size_t(slot) * (d / 16) * bits;
  float rotated[kMaxDim], back[kMaxDim];
  const float inv_root = 1.0f / std::sqrt(float(d));
  for (int j = 0; j < d; ++j) {
    int code = 0;
    for (int w = 0; w < bits; ++w) code |= ((planes[(j / 16) * bits + w] >> (j % 16)) & 1) << w;
    rotated[j] = c[size_t(code)] * inv_root;
  }
  T.unrotate(rotated, back);
  const float norm = from_half(at<uint16_t>(region, L.value_norms)[slot]);
  for (int j = 0; j < d; ++j) v[j] = back[j] * norm;
}

}  // namespace tierlm::kv
