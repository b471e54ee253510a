// Shape: up to kMaxDims 64-bit extents, with overflow-checked element counts.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "meshrt/export.h"
#include "runtime/tensor_desc.h"

namespace meshrt {

class MESHRT_API Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims) : Shape(std::span<const int64_t>(dims)) {}

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return d_[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return d_[static_cast<size_t>(i)]; }
  // Extent of dim d; negative d counts from the end. Throws on an out-of-range dim.
  int64_t at(int d) const;
  // Normalises a possibly negative dim; throws naming the dim and the rank.
  int wrap_dim(int d) const;
  const int64_t* begin() const { return d_.data(); }
  const int64_t* end() const { return d_.data() + ndim_; }
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  // Product of extents; throws on overflow of int64.
  int64_t numel() const;
  void push_back(int64_t v);
  std::string str() const;  // "[2, 3, 4]"
  bool operator==(const Shape& o) const;

 private:
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> d_{};
};

// Contiguous (row-major) strides for a shape.
MESHRT_API Shape contiguous_strides(const Shape& s);

}  // namespace meshrt
