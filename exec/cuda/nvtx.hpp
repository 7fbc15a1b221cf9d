// nvtx.hpp — internal to exec/cuda: an NVTX range per op so Nsight Systems shows
// the same op names as the trace. A no-op when the toolkit's nvtx3 is missing.
#pragma once

#include <string>

#if defined(TDPIPE_HAVE_NVTX)
#include <nvtx3/nvToolsExt.h>
#endif

namespace tdpipe::exec::cuda {

class NvtxRange {
 public:
  explicit NvtxRange(const std::string& name) {
#if defined(TDPIPE_HAVE_NVTX)
    nvtxRangePushA(name.c_str());
#else
    (void)name;
#endif
  }
  ~NvtxRange() {
#if defined(TDPIPE_HAVE_NVTX)
    nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace tdpipe::exec::cuda
