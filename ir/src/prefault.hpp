// prefault.hpp — internal: first-touch a large fresh buffer in one system call.
//
// Why: planning a large plan writes well over 100 MB of fresh memory, and on a
// virtual machine a page fault per 4 KiB page costs about as much as the work
// itself (bench_planner prints the rate). madvise(MADV_POPULATE_WRITE, Linux ≥
// 5.14) maps a range's pages in one call, about a third cheaper than faulting them
// one by one. It changes no byte of the buffer; where it is unsupported or fails,
// the pages fault in on first write as before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace tdpipe::ir::detail {

/// Maps the whole pages inside [p, p + bytes) for writing; small ranges are left alone.
inline void prefault(const void* p, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  if (bytes < (std::size_t{256} << 10)) return;
  static const std::uintptr_t page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const std::uintptr_t begin = (reinterpret_cast<std::uintptr_t>(p) + page - 1) & ~(page - 1);
  const std::uintptr_t end = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(page - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
#else
  (void)p;
  (void)bytes;
#endif
}

/// v.reserve(n) with the new buffer's pages mapped at once.
template <typename T>
void reserve_prefaulted(std::vector<T>& v, std::size_t n) {
  if (v.capacity() >= n) return;
  v.reserve(n);
  prefault(v.data(), v.capacity() * sizeof(T));
}

/// v.assign(n, value) into a prefaulted buffer.
template <typename T>
void assign_prefaulted(std::vector<T>& v, std::size_t n, const T& value) {
  if (v.capacity() < n) {
    std::vector<T>().swap(v);
    reserve_prefaulted(v, n);
  }
  v.assign(n, value);
}

/// v.resize(n) (default values) into a prefaulted buffer.
template <typename T>
void resize_prefaulted(std::vector<T>& v, std::size_t n) {
  reserve_prefaulted(v, n);
  v.resize(n);
}

}  // namespace tdpipe::ir::detail
