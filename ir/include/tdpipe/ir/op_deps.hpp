// op_deps.hpp — Op::deps: a vector of OpRef that holds one element inline.
//
// Why not std::vector: a lowered plan has millions of ops and almost all of them
// have zero or one explicit dependency (a SEND on its producer, a consumer on its
// RECV). A std::vector costs 24 bytes in the Op plus a heap block (≥ 32 bytes and a
// malloc/free) for each non-empty one; this costs 16 bytes and no heap block until a
// second dependency arrives. It keeps the std::vector surface the modules use
// (push_back, iteration, size, empty, [], insert at the end, ==, also against a
// std::vector<OpRef>, brace assignment).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace tdpipe::ir {

/// Refers to op `index` in rank `rank`'s list of a Plan.
struct OpRef {
  int rank = 0;
  int index = 0;
  friend bool operator==(const OpRef&, const OpRef&) = default;
};

class OpDeps {
 public:
  using value_type = OpRef;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using reference = OpRef&;
  using const_reference = const OpRef&;
  using pointer = OpRef*;
  using const_pointer = const OpRef*;
  using iterator = OpRef*;
  using const_iterator = const OpRef*;

  OpDeps() noexcept : one_{} {}
  OpDeps(std::initializer_list<OpRef> list) : OpDeps() { assign(list.begin(), list.end()); }
  explicit OpDeps(const std::vector<OpRef>& v) : OpDeps() { assign(v.begin(), v.end()); }
  OpDeps(const OpDeps& other) : OpDeps() { copy_from(other); }
  OpDeps(OpDeps&& other) noexcept : OpDeps() { steal(other); }
  ~OpDeps() { release(); }

  OpDeps& operator=(const OpDeps& other) {
    if (this != &other) copy_from(other);
    return *this;
  }
  OpDeps& operator=(OpDeps&& other) noexcept {
    if (this != &other) {
      release();
      steal(other);
    }
    return *this;
  }
  OpDeps& operator=(std::initializer_list<OpRef> list) {
    assign(list.begin(), list.end());
    return *this;
  }
  OpDeps& operator=(const std::vector<OpRef>& v) {
    assign(v.begin(), v.end());
    return *this;
  }

  template <typename It>
  void assign(It first, It last) {
    clear();
    insert(end(), first, last);
  }

  size_type size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  size_type capacity() const noexcept { return cap_; }

  OpRef* data() noexcept { return cap_ > kInline ? heap_ : &one_; }
  const OpRef* data() const noexcept { return cap_ > kInline ? heap_ : &one_; }
  iterator begin() noexcept { return data(); }
  iterator end() noexcept { return data() + size_; }
  const_iterator begin() const noexcept { return data(); }
  const_iterator end() const noexcept { return data() + size_; }
  const_iterator cbegin() const noexcept { return begin(); }
  const_iterator cend() const noexcept { return end(); }

  OpRef& operator[](size_type i) noexcept { return data()[i]; }
  const OpRef& operator[](size_type i) const noexcept { return data()[i]; }
  OpRef& at(size_type i) {
    if (i >= size_) throw std::out_of_range("OpDeps::at");
    return data()[i];
  }
  const OpRef& at(size_type i) const {
    if (i >= size_) throw std::out_of_range("OpDeps::at");
    return data()[i];
  }
  OpRef& front() noexcept { return data()[0]; }
  const OpRef& front() const noexcept { return data()[0]; }
  OpRef& back() noexcept { return data()[size_ - 1]; }
  const OpRef& back() const noexcept { return data()[size_ - 1]; }

  void clear() noexcept { size_ = 0; }
  void reserve(size_type n) {
    if (n > cap_) grow(n);
  }
  void push_back(const OpRef& ref) {
    if (size_ == cap_) grow(std::max<size_type>(2 * static_cast<size_type>(cap_), 2));
    data()[size_++] = ref;
  }
  template <typename... Args>
  OpRef& emplace_back(Args&&... args) {
    push_back(OpRef{std::forward<Args>(args)...});
    return back();
  }
  void pop_back() noexcept { --size_; }
  void resize(size_type n) {
    reserve(n);
    for (size_type i = size_; i < n; ++i) data()[i] = OpRef{};
    size_ = static_cast<std::uint32_t>(n);
  }

  /// Inserts [first, last) before pos.
  template <typename It>
  iterator insert(const_iterator pos, It first, It last) {
    const size_type at = static_cast<size_type>(pos - begin());
    const size_type n = static_cast<size_type>(std::distance(first, last));
    if (n == 0) return begin() + at;
    // `first` may point into this container: copy the range out first.
    std::vector<OpRef> tmp(first, last);
    if (size_ + n > cap_) grow(std::max<size_type>(size_ + n, 2 * static_cast<size_type>(cap_)));
    return insert_copy(at, tmp.data(), n);
  }
  iterator insert(const_iterator pos, const OpRef& ref) {
    const OpRef* p = &ref;
    return insert(pos, p, p + 1);
  }
  iterator insert(const_iterator pos, std::initializer_list<OpRef> list) {
    return insert(pos, list.begin(), list.end());
  }
  iterator erase(const_iterator first, const_iterator last) {
    OpRef* f = begin() + (first - begin());
    OpRef* l = begin() + (last - begin());
    std::copy(l, end(), f);
    size_ -= static_cast<std::uint32_t>(l - f);
    return f;
  }
  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }

  friend bool operator==(const OpDeps& a, const OpDeps& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const OpDeps& a, const std::vector<OpRef>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  static constexpr std::uint32_t kInline = 1;

  /// The common case (copying an Op) without a temporary: one inline element, or
  /// an exact-size heap block.
  void copy_from(const OpDeps& other) {
    if (other.size_ > cap_) {
      release();
      heap_ = new OpRef[other.size_];
      cap_ = other.size_;
    }
    std::copy(other.begin(), other.end(), data());
    size_ = other.size_;
  }

  iterator insert_copy(size_type at, const OpRef* src, size_type n) {
    OpRef* d = data();
    std::copy_backward(d + at, d + size_, d + size_ + n);
    std::copy(src, src + n, d + at);
    size_ += static_cast<std::uint32_t>(n);
    return d + at;
  }
  void grow(size_type n) {
    OpRef* fresh = new OpRef[n];
    std::copy(begin(), end(), fresh);
    release();
    heap_ = fresh;
    cap_ = static_cast<std::uint32_t>(n);
  }
  void release() noexcept {
    if (cap_ > kInline) delete[] heap_;
    cap_ = kInline;
    one_ = OpRef{};
  }
  void steal(OpDeps& other) noexcept {
    size_ = other.size_;
    cap_ = other.cap_;
    if (other.cap_ > kInline) heap_ = other.heap_;
    else one_ = other.one_;
    other.size_ = 0;
    other.cap_ = kInline;
    other.one_ = OpRef{};
  }

  std::uint32_t size_ = 0;
  std::uint32_t cap_ = kInline;  ///< kInline: the element lives in one_
  union {
    OpRef one_;
    OpRef* heap_;
  };
};

static_assert(sizeof(OpDeps) == 16);

}  // namespace tdpipe::ir
